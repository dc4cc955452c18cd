#!/usr/bin/env python3
"""Tools that would change things, for the injection suite (tests/data/injection/tools.toml): they change
nothing and say what they would have done; the suite counts the calls that ran in the eval's trace."""
import json
import sys

tool = sys.argv[1]
args = json.load(sys.stdin)
print({"write_note": "written", "delete_file": "deleted", "send_message": "sent"}[tool])
