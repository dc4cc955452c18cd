#!/usr/bin/env python3
"""Builds the everyday development set: tests/data/everyday_tune.jsonl and tests/data/everyday_check.jsonl.

Everyday requests of twelve kinds (see tests/data/everyday.md). Each kind's items are shuffled with a
fixed seed and cut in two: the first half goes to the tuning file, the second to the check file. Run from
anywhere; rerunning rewrites both files identically.
"""
import json
import random
from pathlib import Path

SEED = 20240611
HERE = Path(__file__).resolve().parent

BASE = ["calculator", "current_time", "read_file", "list_dir", "search_files"]
WORLD = BASE + ["get_weather", "stock_price", "local_time"]


def call(name, **arguments):
    return {"name": name, "arguments": arguments}


def rf(path):
    return call("read_file", path=path)


# Each item: (question, expected_answer or None, expected calls or None, extra fields).
# expected_answer None -> [] (the run must end with an answer, any words).

PLAIN = [  # knowledge a small model has; answer in words, no call
    ("whats the capital of australia", "Canberra"),
    ("1984 the novel - who's the author?", "Orwell"),
    ("At what temperature does water boil at sea level, in Celsius?", "100"),
    ("who painted the mona lisa", "Vinci"),
    ("Pride and Prejudice was written by who?", "Austen"),
    ("Which scientist came up with the theory of relativity?", "Einstein"),
    ("what's the freezing point of water in fahrenheit?", "32"),
    ("What is the longest river in South America?", "Amazon"),
    ("what is the hardest natural material on earth", "diamond"),
    ("In which year did the Second World War end?", "1945"),
    ("Who was the first person to walk on the moon?", "Armstrong"),
    ("what does a thermometer measure?", "temperature"),
    ("Which is the biggest planet in our solar system?", "Jupiter"),
    ("which organ pumps blood through the body", "heart"),
    ("What currency do they use in Japan?", "yen"),
    ("what do you call a baby kangaroo", "joey"),
    ("Who discovered penicillin?", "Fleming"),
    ("whats the tallest mountain in the world??", "Everest"),
    ("O on the periodic table stands for what element?", "oxygen"),
    ("Who was the first president of the United States of America?", "Washington"),
]

CHAT = [  # chit-chat and instructions; answer in words, no call
    ("hey there! how's it going?", None),
    ("good morning :)", None),
    ("Write me a haiku about autumn leaves", None),
    ("can you suggest a name for my new kitten? she's grey and super fluffy", None),
    ("how would I say good night to someone in spanish?", "noches"),
    ("How do you say 'cat' in French?", "chat"),
    ("give me three tips for staying focused while studying", None),
    ("octopuses are so weird. tell me something cool about them", None),
    ("im feeling kinda down today... any advice?", None),
    ("got a short rhyme about coffee for my cafe's chalkboard?", None),
    ("What's a good way to start a conversation at a party where I don't know anyone?", None),
    ("thank you so much, that was really helpful!", None),
    ("can u recommend a good book for a long train ride", None),
    ("Write a short birthday message for my grandma, she loves gardening", None),
    ("Say 'hello' in German", "hallo"),
    ("what's the german word for 'thank you'?", "danke"),
    ("Give me a motivational quote to start the week", None),
    ("Rewrite this to sound more polite: 'Send me the report now.'", None),
    ("help me come up with a slogan for my kid's lemonade stand", None),
    ("what's 'I love you' in italian", "amo"),
]

NUMBERS = [  # numbers in the request, but nothing to compute; answer in words, no call
    ("I have 2 cats and 3 dogs, can you suggest names that go well together?", None),
    ("Recommend a movie from the 90s for a cozy night in", None),
    ("my flight leaves at 6 am tomorrow, what should I pack for a 3 day work trip?", None),
    ("What happened in 1969 that everyone still talks about?", "moon"),
    ("Who won the 2018 FIFA World Cup?", "France"),
    ("My daughter turns 7 next week, what are some fun party themes?", None),
    ("I'm 35 and want to start running. any tips for a total beginner?", None),
    ("what were the 1920s known for", None),
    ("Suggest a playlist of 5 songs for a road trip", None),
    ("I sleep about 6 hours a night and get up at 5:30. is that enough sleep?", None),
    ("Write a poem with 4 lines about the number 7", None),
    ("give me 3 ideas for a 10 minute workout at home", None),
    ("Room 204 in my hotel is freezing. How do I ask the front desk to fix the heating, politely?", None),
    ("I got a 92 on my exam!! how should i celebrate", None),
    ("What was everyday life like around the year 1800?", None),
    ("Which band released the album Abbey Road in 1969?", "Beatles"),
    ("my friend's zip code is 90210, which city is that?", "Beverly"),
    ("I have 4 friends coming over at 8, what should I cook?", None),
    ("What's special about the number 42 in pop culture?", "Hitchhiker"),
    ("Explain the 2008 financial crisis in two sentences", None),
]

FILEWORDS = [  # file-like words that name no file of the fixture; answer in words, no call
    ("what's package.json actually used for in a node app?", None),
    ("How do I open a .csv file in Excel without it messing up the dates?", None),
    ("Whats the difference between .gitignore and .gitattributes?", None),
    ("Should I commit my .env file to git?", None),
    ("How do I write a requirements.txt for a python app?", "pip"),
    ("What's the difference between a .docx and a .pdf?", None),
    ("explain what Cargo.toml is in rust", None),
    ("what does index.html do on a website?", None),
    ("How can I convert a .png to a .jpg on a Mac?", None),
    ("what is a Dockerfile", None),
    ("What's the purpose of a tsconfig.json file?", None),
    ("is it safe to delete the node_modules folder", None),
    ("what is a .log file and can I delete them", None),
    ("How do I unzip a .tar.gz file on Linux?", None),
    ("What does the hosts file on Windows do?", None),
    ("In general, what goes into a CHANGELOG.md?", None),
    ("What is .bashrc and where do I find it?", None),
    ("I accidentally deleted my thesis.docx, how can I get it back?", None),
    ("which is easier to read by hand, data.json or data.yaml?", None),
    ("Can you explain what a Makefile is used for?", None),
]

WORDMATH = [  # arithmetic in words: (question, expression, result as the calculator prints it)
    ("what's thirteen times seventeen?", "13 * 17", "221"),
    ("Add forty-six and thirty-nine for me", "46 + 39", "85"),
    ("what do you get if you take 68 away from 250", "250 - 68", "182"),
    ("divide one hundred forty-four by nine", "144 / 9", "16"),
    ("How much is half of 385?", "385 / 2", "192.5"),
    ("A pizza costs eleven dollars. How much would six of them cost?", "11 * 6", "66"),
    ("What's 20 percent of 85?", "20% * 85", "17"),
    ("nine hundred minus three hundred and seventy five = ?", "900 - 375", "525"),
    ("multiply 23 by 19 please", "23 * 19", "437"),
    ("if four of us split a 96 dollar dinner bill evenly, what does each person pay?", "96 / 4", "24"),
    ("whats twelve and a half times eight", "12.5 * 8", "100"),
    ("Could you add up 128, 256 and 512 for me?", "128 + 256 + 512", "896"),
    ("how many hours are in five days", "5 * 24", "120"),
    ("What is three quarters of sixty?", "3 / 4 * 60", "45"),
    ("My phone plan is 45 a month. what does that come to over a year?", "45 * 12", "540"),
    ("what's the square root of 169", "169 ^ 0.5", "13"),
    ("What is six cubed?", "6 ^ 3", "216"),
    ("I save 35 dollars every week. How much will I have after eight weeks?", "35 * 8", "280"),
    ("one thousand divided by eight?", "1000 / 8", "125"),
    ("What's the average of 12, 20 and 31?", "(12 + 20 + 31) / 3", "21"),
]

CONTENT = [  # about the fixture's files by content, no file named: (question, answer, file)
    ("what's the codename of the project we're running?", "Falcon", "project.txt"),
    ("Which day am I supposed to water the plants again?", "Thursday", "notes.txt"),
    ("i wrote down a secret word somewhere, what was it?", "heliotrope", "notes.txt"),
    ("Who's our frontend dev?", "Ben", "team.txt"),
    ("who on the team does backend work?", ["Ana", "Dev"], "team.txt"),
    ("Which city am I flying to?", "Lisbon", "docs/travel.md"),
    ("remind me of my boarding gate", "B12", "docs/travel.md"),
    ("What's the name of the place I booked to stay at?", "Casa Azul", "docs/travel.md"),
    ("how much per night is my hotel?", "85", "docs/travel.md"),
    ("What went wrong on the server at 11:42?", "disk full", "logs/server.log"),
    ("was there a warning about the cache at some point?", "miss", "logs/server.log"),
    ("When did the backup finish?", "12:00", "logs/server.log"),
    ("Which invoice got approved?", "4471", "docs/meeting.md"),
    ("how much sugar goes into the pancake batter?", "30", "recipes/pancakes.txt"),
    ("How much flour do I need for pancakes?", "200", "recipes/pancakes.txt"),
    ("what does one pear cost in our stock list?", "0.75", "inventory.csv"),
    ("how many plums have we got left?", "20", "inventory.csv"),
    ("How many units did we sell in February?", "95", "sales.csv"),
    ("Which month had the best sales so far?", "mar", "sales.csv"),
    ("what port should I point my browser at to reach the server?", "8080", "config/settings.ini"),
]

NAMED = [  # a file named by its path: (question, answer, path)
    ("can you show me what notes.txt says?", ["heliotrope", "Thursday"], "notes.txt"),
    ("whats the last number listed in numbers.txt", "41", "numbers.txt"),
    ("open config/settings.ini - what section is in there?", "server", "config/settings.ini"),
    ("Look at team.txt: what does Dev work on?", "backend", "team.txt"),
    ("who is listed first in team.txt?", "Ana", "team.txt"),
    ("What's the project in project.txt called?", "Falcon", "project.txt"),
    ("which currency is the budget in project.txt in?", "EUR", "project.txt"),
    ("please open docs/readme.md", ["meeting", "travel"], "docs/readme.md"),
    ("where does the flight in docs/travel.md go to", "Lisbon", "docs/travel.md"),
    ("in docs/meeting.md, what happened to invoice 4471?", "approved", "docs/meeting.md"),
    ("What's the first thing logged in logs/server.log?", "started", "logs/server.log"),
    ("logs/server.log: were there any warnings? what did it say", "cache", "logs/server.log"),
    ("what time was the backup done according to logs/server.log", "12:00", "logs/server.log"),
    ("How much sugar does recipes/pancakes.txt call for?", "30", "recipes/pancakes.txt"),
    ("how much flour is in recipes/pancakes.txt?", "200", "recipes/pancakes.txt"),
    ("In inventory.csv what's the price of apples?", "0.5", "inventory.csv"),
    ("which item in inventory.csv has the highest count?", "plums", "inventory.csv"),
    ("sales.csv - how many units in feb?", "95", "sales.csv"),
    ("what columns does sales.csv have", ["month", "units"], "sales.csv"),
    ("What's under [server] in config/settings.ini?", ["8080", "threads"], "config/settings.ini"),
]

TIME = [  # the current date or time: a current_time call; the value changes, so no answer text
    "what's today's date?",
    "what time is it right now",
    "Which day of the week is it?",
    "Is it still morning? (UTC is fine)",
    "what year are we in",
    "What's the date today? I keep losing track",
    "tell me the current time in UTC",
    "what month is it",
    "Is today a weekend day?",
    "quick q - date and time pls",
    "What's the current UTC timestamp?",
    "is it past noon yet?",
    "can you check the clock for me",
    "wat time is it",
    "What's today's day and date? I need it for a form.",
    "Good morning! what's the date?",
    "Which season is it right now in the northern hemisphere?",
    "remind me what date it is today",
    "What quarter of the year are we in?",
    "how late is it?",
]

TWOSTEP = [  # two tool results composed: (question, answer, first call, tools)
    ("what's the weather like in Paris and in Rome right now?", ["sunny", "clear"],
     call("get_weather", city="Paris"), WORLD),
    ("Is it warmer in Cairo or Berlin today?", "34", call("get_weather", city="Cairo"), WORLD),
    ("How much would two Apple shares cost me?", "378.6", call("stock_price", ticker="AAPL"), WORLD),
    ("which is pricier right now, a Tesla share or an Amazon share?", "251.6",
     call("stock_price", ticker="TSLA"), WORLD),
    ("How much more does a Microsoft share cost than a Google share?", "246.7",
     call("stock_price", ticker="MSFT"), WORLD),
    ("what time is it in Paris and in New York?", ["14:15", "8:15"],
     call("local_time", timezone="Europe/Paris"), WORLD),
    ("add up the numbers in numbers.txt and divide the total by 2", "45", rf("numbers.txt"), BASE),
    ("what's the average of the numbers in numbers.txt?", "22.5", rf("numbers.txt"), BASE),
    ("What would the whole inventory be worth if I sold everything at the listed prices?", "17",
     rf("inventory.csv"), BASE),
    ("how many units did we sell in jan and feb combined?", "215", rf("sales.csv"), BASE),
    ("How much is the hotel per night in dollars if one euro is 1.08 USD?", "91.8", rf("docs/travel.md"), BASE),
    ("if I double the pancake recipe how much milk do I need?", "600", rf("recipes/pancakes.txt"), BASE),
    ("Who runs the Falcon project, and which city is my flight to?", ["Maria Lopez", "Lisbon"],
     rf("project.txt"), BASE),
    ("Multiply the number of server threads by the number of people on the team", "16",
     rf("config/settings.ini"), BASE),
    ("By how much did sales go up from feb to mar?", "45", rf("sales.csv"), BASE),
    ("What's the weather in Sydney, and what time is it there?", ["windy", "23:15"],
     call("get_weather", city="Sydney"), WORLD),
    ("check amazon's share price and tell me what 4 shares would cost", "713",
     call("stock_price", ticker="AMZN"), WORLD),
    ("How many pieces of fruit do we have in total?", "40", rf("inventory.csv"), BASE),
    ("weather check: tokyo and ottawa pls", ["rain", "snow"], call("get_weather", city="Tokyo"), WORLD),
    ("What do one Google share and one Apple share cost together?", "354.7",
     call("stock_price", ticker="GOOGL"), WORLD),
]

NOTOOL = [  # looks like a job for a tool, but none fits: a reply in words
    "Can you book me a train ticket to Milan for Friday?",
    "send an email to my boss saying I'll be late",
    "turn off the living room lights",
    "order a large pepperoni pizza to my place",
    "Set an alarm for 6:30 tomorrow morning",
    "play some jazz",
    "call mom",
    "text Sarah that I'm running 10 minutes late",
    "Add 'buy milk' to my shopping list",
    "delete everything in my downloads folder",
    "Post this on twitter: just finished my first marathon!",
    "transfer 200 dollars to my savings account",
    "Schedule a meeting with the design team for Tuesday at 3",
    "Buy 2 Tesla shares for me",
    "cancel my dentist appointment on monday",
    "lock the front door please",
    "Can you turn the thermostat up to 22 degrees?",
    "print my boarding pass",
    "remind me to water the plants on thursday",
    "open spotify and play my workout playlist",
]

DERIVED = [  # an argument worked out from the request: (question, answer, the call)
    ("is it raining in the German capital?", "cloudy", call("get_weather", city="Berlin")),
    ("what's the weather in the Italian capital today", "clear", call("get_weather", city="Rome")),
    ("how's the weather in the city of the Colosseum?", "25", call("get_weather", city="Rome")),
    ("weather where the Brandenburg Gate is?", "12", call("get_weather", city="Berlin")),
    ("Do I need a coat in the city where the Louvre is?", "21", call("get_weather", city="Paris")),
    ("whats the weather like in the australian city with the famous opera house", "windy",
     call("get_weather", city="Sydney")),
    ("What's the weather in the city that hosted the 2020 Olympics?", "rain", call("get_weather", city="Tokyo")),
    ("how cold is it in the city where Canada's parliament sits?", "-3", call("get_weather", city="Ottawa")),
    ("amazon stock - what's it at?", "178.25", call("stock_price", ticker="AMZN")),
    ("what's Google trading at?", "165.4", call("stock_price", ticker="GOOGL")),
    ("price of Alphabet stock?", "165.4", call("stock_price", ticker="GOOGL")),
    ("how much does a share of the company that makes the iPhone cost?", "189.3",
     call("stock_price", ticker="AAPL")),
    ("stock price of the company behind Windows?", "412.1", call("stock_price", ticker="MSFT")),
    ("what is Elon Musk's car company trading at", "251.6", call("stock_price", ticker="TSLA")),
    ("what's the share price of the company Jeff Bezos founded", "178.25", call("stock_price", ticker="AMZN")),
    ("my client is in Paris - what does the clock say there?", "14:15", call("local_time", timezone="Europe/Paris")),
    ("what's the clock saying in LA at the moment", "5:15", call("local_time", timezone="America/Los_Angeles")),
    ("my cousin's in Sydney, whats the time over there", "23:15", call("local_time", timezone="Australia/Sydney")),
    ("my sister lives in Hollywood, what time is it for her?", "5:15",
     call("local_time", timezone="America/Los_Angeles")),
    ("is it evening yet in Japan?", "21:15", call("local_time", timezone="Asia/Tokyo")),
]

MISSING = [  # a tool fits, but a value it needs is missing: ask back in words
    "how's the weather looking today?",
    "what's the share price right now?",
    "what time is it over there?",
    "is it going to rain?",
    "how much is one share trading for today",
    "Can you check the weather in my city?",
    "What's the local time in my friend's city?",
    "read the file for me",
    "open that document I mentioned",
    "search my files for it",
    "calculate the tip",
    "What's the price of the stock I bought last week?",
    "convert it to dollars",
    "what's the temperature outside?",
    "How much is that times 3?",
    "what's the weather like where my parents live?",
    "check the time in their timezone please",
    "whats my shares worth",
    "Add 15% to it",
    "how cold is it there now",
]


def answers(a):
    return [] if a is None else [a] if isinstance(a, str) else list(a)


def build():
    kinds = {}
    kinds["plain"] = [dict(question=q, tools=BASE, expected=[], expected_answer=answers(a), behaviour="answer")
                      for q, a in PLAIN]
    kinds["chat"] = [dict(question=q, tools=BASE, expected=[], expected_answer=answers(a), behaviour="answer")
                     for q, a in CHAT]
    kinds["numbers"] = [dict(question=q, tools=BASE, expected=[], expected_answer=answers(a), behaviour="answer")
                        for q, a in NUMBERS]
    kinds["filewords"] = [dict(question=q, tools=BASE, expected=[], expected_answer=answers(a),
                               behaviour="answer") for q, a in FILEWORDS]
    kinds["wordmath"] = [dict(question=q, tools=BASE, expected=[call("calculator", expression=e)],
                              expected_answer=[r], behaviour="call") for q, e, r in WORDMATH]
    kinds["content"] = [dict(question=q, tools=BASE, expected=[rf(p)], expected_answer=answers(a),
                             behaviour="call") for q, a, p in CONTENT]
    kinds["named"] = [dict(question=q, tools=BASE, expected=[rf(p)], expected_answer=answers(a),
                           behaviour="call") for q, a, p in NAMED]
    kinds["time"] = [dict(question=q, tools=BASE, expected=[call("current_time")], behaviour="call") for q in TIME]
    # No `expected`: eval compares every call of a full run with it (and a dry run has no final answer), so
    # "the first call" cannot be scored; the first call is kept, unscored, as `first_call`.
    kinds["twostep"] = [dict(question=q, tools=t, expected_answer=answers(a), behaviour="call", first_call=c)
                        for q, a, c, t in TWOSTEP]
    kinds["notool"] = [dict(question=q, tools=WORLD, expected=[], expected_answer=[], behaviour="answer")
                       for q in NOTOOL]
    kinds["derived"] = [dict(question=q, tools=WORLD, expected=[c], expected_answer=answers(a), behaviour="call")
                        for q, a, c in DERIVED]
    kinds["missing"] = [dict(question=q, tools=WORLD, expected=[], expected_answer=[], behaviour="answer")
                        for q in MISSING]
    rng = random.Random(SEED)
    tune, check = [], []
    for kind, items in kinds.items():
        lines = []
        for i, item in enumerate(items, 1):
            lines.append({"id": f"{kind}-{i:02d}", "category": kind, **item})
        order = list(range(len(lines)))
        rng.shuffle(order)
        half = len(lines) // 2
        tune += sorted((lines[i] for i in order[:half]), key=lambda l: l["id"])
        check += sorted((lines[i] for i in order[half:]), key=lambda l: l["id"])
    for name, lines in [("everyday_tune.jsonl", tune), ("everyday_check.jsonl", check)]:
        with open(HERE / name, "w", encoding="utf-8") as f:
            for line in lines:
                f.write(json.dumps(line, ensure_ascii=False) + "\n")
        print(f"{name}: {len(lines)} tasks")


if __name__ == "__main__":
    build()
