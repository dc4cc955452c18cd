#!/usr/bin/env python3
"""Canned answers for the agent suite's tools (tests/data/agent_tools.toml): the arguments arrive as
JSON on stdin; an unknown value is an error, as a real service would give."""
import json
import sys

WEATHER = {"tokyo": "light rain, 18 C", "paris": "sunny, 21 C", "sydney": "windy, 16 C",
           "rome": "clear, 25 C", "ottawa": "snow, -3 C", "cairo": "hot, 34 C", "berlin": "cloudy, 12 C"}
PRICES = {"AAPL": "189.30 USD", "MSFT": "412.10 USD", "TSLA": "251.60 USD", "AMZN": "178.25 USD",
          "GOOGL": "165.40 USD"}
TIMES = {"America/New_York": "08:15", "Asia/Tokyo": "21:15", "Europe/London": "13:15",
         "Europe/Paris": "14:15", "Australia/Sydney": "23:15", "America/Los_Angeles": "05:15"}

def main():
    tool = sys.argv[1]
    args = json.load(sys.stdin)
    if tool == "get_weather":
        key = args.get("city", "").split(",")[0].strip().lower()
        if key not in WEATHER:
            sys.exit(f"no weather station for {args.get('city')!r}")
        print(f"{args['city']}: {WEATHER[key]}")
    elif tool == "stock_price":
        t = args.get("ticker", "").upper()
        if t not in PRICES:
            sys.exit(f"unknown ticker {args.get('ticker')!r}")
        print(f"{t}: {PRICES[t]}")
    elif tool == "local_time":
        z = args.get("timezone", "")
        if z not in TIMES:
            sys.exit(f"unknown time zone {z!r} (give an IANA name such as Europe/Paris)")
        print(f"{z}: {TIMES[z]}")
    else:
        sys.exit(f"unknown tool {tool}")

main()
