#!/usr/bin/env bash
# BFCL v4 multi_turn_base run by BFCL's own harness (bfcl-eval) against an OpenAI-compatible server: its
# chat-completions function-calling handler (the `openbmb/MiniCPM-SALA-FC` entry) with OPENAI_BASE_URL
# pointed at the server, then `bfcl evaluate` on the ids that were generated.
#
#   benches/bfcl/multi_turn.sh BASE_URL WORK_DIR FIRST LAST
#
# BASE_URL: http://127.0.0.1:8080/v1 (`reagent serve --model M`, or llama.cpp's OpenAI server on the same
# file). WORK_DIR: where BFCL keeps its results and scores (a fresh folder per server and model). Ids
# multi_turn_base_FIRST..LAST; 0..99 are the development ids, the rest are held out. Needs a Python
# environment with `bfcl-eval==2026.3.23` and `soundfile` (BFCL imports it): BFCL=/path/to/venv/bin/bfcl.
set -euo pipefail
base=$1 work=$2 first=$3 last=$4
bfcl=${BFCL:-bfcl}
model=openbmb/MiniCPM-SALA-FC
mkdir -p "$work"
work=$(cd "$work" && pwd)
python3 - "$work/test_case_ids_to_generate.json" "$first" "$last" <<'PY'
import json, sys
path, first, last = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
json.dump({"multi_turn_base": [f"multi_turn_base_{i}" for i in range(first, last + 1)]}, open(path, "w"))
PY
export BFCL_PROJECT_ROOT=$work OPENAI_BASE_URL=$base OPENAI_API_KEY=${OPENAI_API_KEY:-unused}
start=$(date +%s)
"$bfcl" generate --model "$model" --test-category multi_turn_base --run-ids --num-threads 1 --temperature 0
echo "generated in $(( $(date +%s) - start )) s"
"$bfcl" evaluate --model "$model" --test-category multi_turn_base --partial-eval
# Per conversation: right or not, and any error the harness recorded.
python3 - "$work" <<'PY'
import glob, json, sys
work = sys.argv[1]
results = [json.loads(l) for f in glob.glob(f"{work}/result/**/*multi_turn_base*.json", recursive=True) for l in open(f)]
errors = [r["id"] for r in results if "error" in json.dumps(r.get("result", ""))[:200].lower()]
scores = [json.loads(l) for f in glob.glob(f"{work}/score/**/*multi_turn_base*.json", recursive=True) for l in open(f)]
head = scores[0] if scores else {}
print(f"conversations generated: {len(results)}; with an error in the result: {len(errors)} {errors[:5]}")
print(f"accuracy: {head.get('accuracy')} ({head.get('correct_count')}/{head.get('total_count')})")
PY
