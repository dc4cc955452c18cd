#!/usr/bin/env python3
"""Writes the malformed-input corpus for `tests/corpus.rs`: tools files, JSON schemas, Lark grammars,
regexes and task files, each with what its one-line error must say. (Damaged GGUF files are written by
the test itself from the tiny-model writer, since they need valid tensors around the damage.)

Run from anywhere: `python3 tests/data/bad/make_corpus.py`; it rewrites the files beside it and
`cases.jsonl` (one line per file: `file`, the `kind` that says how the test feeds it to reagent, and
`expect`: fragments the error line must contain).
"""

import json
import os
import shutil

HERE = os.path.dirname(os.path.abspath(__file__))
CASES = []


def case(kind, name, body, *expect):
    path = os.path.join(HERE, kind, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    mode = "wb" if isinstance(body, bytes) else "w"
    with open(path, mode) as f:
        f.write(body)
    CASES.append({"file": f"{kind}/{name}", "kind": kind, "expect": list(expect)})


def tool_toml(extra, name='"t"', command='["true"]'):
    return f"[[tool]]\nname = {name}\ncommand = {command}\n{extra}"


# ---- tools files ------------------------------------------------------------------------------------
T = "tools"
case(T, "not_toml.toml", "[[tool]\nname = ", "not_toml.toml")
case(T, "no_name.toml", "[[tool]]\ncommand = [\"true\"]\n", "no_name.toml", "name")
case(T, "no_command.toml", "[[tool]]\nname = \"t\"\n", "no_command.toml", "command")
case(T, "empty_command.toml", tool_toml("", command="[]"), "`t`", "command")
case(T, "empty_program.toml", tool_toml("", command='[""]'), "`t`", "command")
case(T, "bad_name_space.toml", tool_toml("", name='"two words"'), "two words", "names")
case(T, "bad_name_empty.toml", tool_toml("", name='""'), "tool ``", "names")
case(T, "bad_name_slash.toml", tool_toml("", name='"a/b"'), "a/b", "names")
case(T, "name_final_answer.toml", tool_toml("", name='"final_answer"'), "final_answer")
case(T, "duplicate_names.toml", tool_toml("") + tool_toml(""), "`t`", "twice")
case(T, "timeout_huge.toml", tool_toml("timeout_s = 1e300\n"), "`t`", "timeout_s")
case(T, "timeout_zero.toml", tool_toml("timeout_s = 0\n"), "`t`", "timeout_s")
case(T, "timeout_negative.toml", tool_toml("timeout_s = -5\n"), "`t`", "timeout_s")
case(T, "timeout_nan.toml", tool_toml("timeout_s = nan\n"), "`t`", "timeout_s")
case(T, "timeout_inf.toml", tool_toml("timeout_s = inf\n"), "`t`", "timeout_s")
case(T, "timeout_string.toml", tool_toml('timeout_s = "ten"\n'), "timeout_string.toml", "timeout_s")
case(T, "max_output_huge.toml", tool_toml("max_output_bytes = 1000000000000\n"), "`t`", "max_output_bytes")
case(T, "max_output_negative.toml", tool_toml("max_output_bytes = -1\n"), "max_output_negative.toml")
case(T, "unknown_field.toml", tool_toml("colour = \"red\"\n"), "unknown_field.toml", "colour")
case(T, "unknown_table.toml", "[[tool]]\nname = \"t\"\ncommand = [\"true\"]\n[[tools2]]\n", "tools2")
case(T, "parameters_not_object.toml", tool_toml("parameters = 5\n"), "`t`", "parameters")
case(T, "parameters_array_type.toml", tool_toml('parameters = { type = "array" }\n'), "`t`", "object")
case(T, "parameters_bad_type.toml", tool_toml('parameters = { type = "object", properties = { a = { type = "banana" } } }\n'),
     "`t`", "schema")
case(T, "parameters_bad_required.toml", tool_toml('parameters = { type = "object", required = 3 }\n'), "`t`", "schema")
case(T, "command_not_array.toml", tool_toml("", command='"true"'), "command_not_array.toml")
case(T, "command_numbers.toml", tool_toml("", command="[1, 2]"), "command_numbers.toml")
case(T, "not_json.json", "{\"tools\": [", "not_json.json")
case(T, "json_wrong_shape.json", "[1, 2, 3]", "json_wrong_shape.json")
case(T, "json_no_name.json", json.dumps({"tools": [{"command": ["true"]}]}), "json_no_name.json", "name")
case(T, "json_unknown_field.json", json.dumps({"tools": [], "extra": 1}), "json_unknown_field.json", "extra")
case(T, "mcp_no_command.toml", "[[mcp]]\nname = \"s\"\n", "mcp_no_command.toml", "command")
case(T, "mcp_bad_name.toml", "[[mcp]]\nname = \"a b\"\ncommand = \"x\"\n", "a b", "name")
case(T, "mcp_empty_command.toml", "[[mcp]]\nname = \"s\"\ncommand = \"\"\n", "`s`", "command")
case(T, "mcp_unknown_field.toml", "[[mcp]]\nname = \"s\"\ncommand = \"x\"\nport = 1\n", "port")
case(T, "mcp_duplicate.toml", "[[mcp]]\nname = \"s\"\ncommand = \"x\"\n[[mcp]]\nname = \"s\"\ncommand = \"y\"\n", "two servers")
case(T, "mcp_timeout_huge.toml", "[[mcp]]\nname = \"s\"\ncommand = \"x\"\ntimeout_s = 1e19\n", "`s`", "timeout_s")
case(T, "mcp_missing_program.toml", "[[mcp]]\nname = \"s\"\ncommand = \"/nonexistent/server\"\n", "`s`", "cannot run")
case(T, "mcp_exits.toml", "[[mcp]]\nname = \"s\"\ncommand = \"false\"\ntimeout_s = 5\n", "`s`", "did not start")
case(T, "mcp_env_not_table.toml", "[[mcp]]\nname = \"s\"\ncommand = \"x\"\nenv = 3\n", "mcp_env_not_table.toml")
case(T, "bom_then_garbage.toml", "\ufeff[[tool]\n", "bom_then_garbage.toml")
case(T, "not_utf8.toml", b"[[tool]]\nname = \"\xff\xfe\"\n", "not_utf8.toml", "UTF-8")
case(T, "nul_bytes.toml", "[[tool]]\nname = \"t\0\"\ncommand = [\"true\"]\n", "nul_bytes.toml")
case(T, "deep_inline_tables.toml", "x = " + "{a = " * 3000 + "1" + "}" * 3000 + "\n", "deep_inline_tables.toml")
case(T, "empty.toml", "", "empty.toml")

# ---- JSON schemas (generate --json-schema) -----------------------------------------------------------
S = "schema"
case(S, "not_json.json", "{\"type\": ", "not_json.json", "JSON")
case(S, "trailing_garbage.json", "{\"type\": \"object\"} x", "trailing_garbage.json", "JSON")
case(S, "bad_type.json", json.dumps({"type": "banana"}), "invalid", "bad_type.json")
case(S, "bad_pattern.json", json.dumps({"type": "string", "pattern": "(unclosed"}), "invalid", "bad_pattern.json")
case(S, "lookahead_pattern.json", json.dumps({"type": "string", "pattern": "^(?=a)b$"}), "invalid", "lookahead_pattern.json", "look-around")
case(S, "ref_loop.json", json.dumps({"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}}),
     "invalid", "ref_loop.json", "matches no text")
case(S, "ref_missing.json", json.dumps({"$ref": "#/$defs/nope"}), "invalid", "ref_missing.json")
case(S, "ref_remote.json", json.dumps({"$ref": "https://example.invalid/schema.json"}), "invalid", "ref_remote.json")
case(S, "min_gt_max.json", json.dumps({"type": "integer", "minimum": 5, "maximum": 1}), "invalid", "min_gt_max.json")
case(S, "minlength_gt_max.json", json.dumps({"type": "string", "minLength": 9, "maxLength": 2}), "invalid", "minlength_gt_max.json")
case(S, "required_not_list.json", json.dumps({"type": "object", "required": "a"}), "invalid", "required_not_list.json")
case(S, "enum_empty.json", json.dumps({"enum": []}), "invalid", "enum_empty.json")
case(S, "false_schema.json", "false", "invalid", "false_schema.json")
case(S, "number_schema.json", "42", "invalid", "number_schema.json")
case(S, "deep_nesting.json", '{"type":"array","items":' * 2000 + '{"type":"integer"}' + "}" * 2000, "deep_nesting.json")
case(S, "deep_json_arrays.json", "[" * 20000 + "]" * 20000, "deep_json_arrays.json")
case(S, "not_utf8.json", b"{\"type\": \"\xff\"}", "not_utf8.json", "UTF-8")
case(S, "empty.json", "", "empty.json", "JSON")
case(S, "allof_conflict.json", json.dumps({"allOf": [{"type": "string"}, {"type": "integer"}]}), "invalid", "allof_conflict.json")
case(S, "bad_format_type.json", json.dumps({"type": "object", "properties": 5}), "invalid", "bad_format_type.json")

# ---- Lark grammars (generate --lark) ----------------------------------------------------------------
L = "lark"
case(L, "syntax_error.lark", "start: (\n", "invalid", "syntax_error.lark")
case(L, "undefined_rule.lark", "start: missing\n", "invalid", "undefined_rule.lark")
case(L, "no_start.lark", "other: \"a\"\n", "invalid", "no_start.lark")
case(L, "bad_regex.lark", "start: /(unclosed/\n", "invalid", "bad_regex.lark")
case(L, "left_recursion_only.lark", "start: start \"a\"\n", "invalid", "left_recursion_only.lark")
case(L, "bad_json_directive.lark", "start: %json { \"type\": }\n", "invalid", "bad_json_directive.lark")
case(L, "empty.lark", "", "invalid", "empty.lark")
case(L, "lookahead.lark", "start: /(?=a)a/\n", "invalid", "lookahead.lark")
case(L, "not_utf8.lark", b"start: \"\xff\"\n", "not_utf8.lark", "UTF-8")
case(L, "unknown_directive.lark", "%frobnicate\nstart: \"a\"\n", "invalid", "unknown_directive.lark")

# ---- regexes (generate --regex, read from the file by the test) -----------------------------------------
R = "regex"
case(R, "unclosed_group.txt", "(abc", "invalid regex", "--regex")
case(R, "unclosed_class.txt", "[abc", "invalid regex", "--regex")
case(R, "bad_repeat.txt", "a{5,2}", "invalid regex", "--regex")
case(R, "lookbehind.txt", "(?<=a)b", "invalid regex", "--regex")
case(R, "backreference.txt", "(a)\\1", "invalid regex", "--regex")
case(R, "dangling_escape.txt", "abc\\", "invalid regex", "--regex")
case(R, "nothing_to_repeat.txt", "*a", "invalid regex", "--regex")
case(R, "huge_repeat.txt", "a{1000000}", "invalid regex", "--regex")
case(R, "bad_unicode_class.txt", "\\p{NotAClass}", "invalid regex", "--regex")

# ---- task files (eval --dry-run) ---------------------------------------------------------------------
K = "tasks"
Q = {"id": "a", "question": "q"}
def line(obj):
    return json.dumps(obj) + "\n"
case(K, "not_json.jsonl", "{\"id\": \n", "not_json.jsonl:1")
case(K, "second_line_bad.jsonl", line(Q) + "nope\n", "second_line_bad.jsonl:2")
case(K, "no_id.jsonl", line({"question": "q"}), "no_id.jsonl:1", "id")
case(K, "id_number.jsonl", line({"id": 5, "question": "q"}), "id_number.jsonl:1")
case(K, "duplicate_id.jsonl", line(Q) + line(Q), "duplicate_id.jsonl:2", "duplicate")
case(K, "both_question_and_messages.jsonl", line({"id": "a", "question": "q", "messages": [{"role": "user", "content": "q"}]}),
     "both_question_and_messages.jsonl:1", "exactly one")
case(K, "neither.jsonl", line({"id": "a"}), "neither.jsonl:1", "exactly one")
case(K, "no_user_turn.jsonl", line({"id": "a", "messages": [{"role": "system", "content": "s"}]}), "no_user_turn.jsonl:1", "user")
case(K, "bad_role.jsonl", line({"id": "a", "messages": [{"role": "wizard", "content": "q"}]}), "bad_role.jsonl:1")
case(K, "content_number.jsonl", line({"id": "a", "messages": [{"role": "user", "content": 3}]}), "content_number.jsonl:1")
case(K, "functions_not_list.jsonl", line({**Q, "functions": {"name": "f"}}), "functions_not_list.jsonl:1")
case(K, "function_no_name.jsonl", line({**Q, "functions": [{"parameters": {"type": "object"}}]}), "function_no_name.jsonl:1", "name")
case(K, "function_bad_name.jsonl", line({**Q, "functions": [{"name": "a b", "parameters": {"type": "object"}}]}),
     "function_bad_name.jsonl:1", "a b")
case(K, "function_twice.jsonl", line({**Q, "functions": [{"name": "f"}, {"name": "f"}]}), "function_twice.jsonl:1", "twice")
case(K, "function_bad_schema.jsonl", line({**Q, "functions": [{"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "banana"}}}}]}),
     "function_bad_schema.jsonl:1", "`f`")
case(K, "function_string_params.jsonl", line({**Q, "functions": [{"name": "f", "parameters": {"type": "string"}}]}),
     "function_string_params.jsonl:1", "object")
case(K, "function_final_answer.jsonl", line({**Q, "functions": [{"name": "final_answer"}]}), "function_final_answer.jsonl:1", "final_answer")
case(K, "expected_not_list.jsonl", line({**Q, "expected": {"name": "f"}}), "expected_not_list.jsonl:1")
case(K, "tools_and_function_clash.jsonl", line({**Q, "functions": [{"name": "calculator"}], "tools": ["calculator"]}),
     "tools_and_function_clash.jsonl:1", "calculator")
case(K, "not_utf8.jsonl", b"{\"id\": \"\xff\", \"question\": \"q\"}\n", "not_utf8.jsonl", "UTF-8")
case(K, "array_line.jsonl", "[1, 2]\n", "array_line.jsonl:1")
case(K, "deep_json.jsonl", "[" * 20000 + "]" * 20000 + "\n", "deep_json.jsonl:1")
case(K, "category_number.jsonl", line({**Q, "category": 7}), "category_number.jsonl:1")
case(K, "tools_not_strings.jsonl", line({**Q, "tools": [1]}), "tools_not_strings.jsonl:1")

# Stale files of a previous run go first, so the directory is exactly the manifest.
for kind in {c["kind"] for c in CASES}:
    listed = {os.path.basename(c["file"]) for c in CASES if c["kind"] == kind}
    for f in os.listdir(os.path.join(HERE, kind)):
        if f not in listed:
            os.remove(os.path.join(HERE, kind, f))
with open(os.path.join(HERE, "cases.jsonl"), "w") as f:
    for c in CASES:
        f.write(json.dumps(c) + "\n")
print(f"{len(CASES)} cases")
