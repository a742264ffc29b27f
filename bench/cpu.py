# A short, typical agent-style script: a few stdlib imports and ~50 ms of work
# (JSON round trips, regexes, hashing), deterministic, no I/O beyond stdout.
import hashlib
import json
import re

WORD = re.compile(r"[a-z]+\d*")

records = [{"id": i, "name": f"item{i}", "tags": ["a", "b", str(i % 7)]} for i in range(200)]
digest = hashlib.sha256()
matches = 0
for _ in range(60):
    text = json.dumps(records)
    matches += len(WORD.findall(text))
    digest.update(json.loads(text)[-1]["name"].encode())
    digest.update(text.encode())
print(matches, digest.hexdigest()[:16])
