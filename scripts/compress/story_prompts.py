#!/usr/bin/env python3
"""240 story and memoir openings (48 subjects x 5 openers) for sequence-level distillation:
the teacher continues each one. Writes prompts.jsonl (or the path given as the argument)."""
import json, random, sys
random.seed(7)
subjects = [
 "a village baker who rose every night at three", "the ferry that crossed the river at Halden",
 "an old clockmaker and his apprentice", "a schoolteacher sent to a mountain village",
 "the last tram driver of a northern city", "a family of fishermen on a windy coast",
 "a librarian who kept a secret room of letters", "a radio operator during a long winter",
 "two sisters who ran a small hotel by the sea", "a shepherd and the dog that would not leave him",
 "the building of a stone bridge over a gorge", "a travelling circus stranded by snow",
 "a young doctor in a mining town", "a gardener who grew roses for a widowed duchess",
 "the night the mill caught fire", "a boy who found a map in his grandfather's coat",
 "a postwoman on an island with one road", "the harvest festival in a valley town",
 "a sailor returning home after ten years", "a carpenter who built violins in his spare time",
 "the first winter in a new settlement", "an astronomer who lost her sight",
 "the railway station at the edge of the desert", "a merchant caught in a sandstorm",
 "a retired soldier who kept bees", "a girl who taught herself to read from newspapers",
 "the flood that changed the course of the river", "a monk copying books by candlelight",
 "a painter who could only paint the sea", "the market square on a rainy Saturday",
 "an orphan raised by a blacksmith", "a woman who walked from one coast to the other",
 "the closing of the town's only cinema", "a pilot who delivered mail over the mountains",
 "an innkeeper who listened to every traveller's story", "a family moving to the city",
 "the old oak at the crossroads", "a brother and sister lost in a forest",
 "a ship's cook on a whaling voyage", "the election in a small parish",
 "a watchmaker's daughter who wanted to be an engineer", "a fox that lived under the church",
 "the winter the lake froze solid", "a musician who played at every wedding in the county",
 "a surveyor mapping an unknown coast", "the quarrel between two neighbouring farms",
 "a nurse in a field hospital", "the building of the town's first school",
]
forms = [
 "{T}\n\n", "Chapter One\n\n", "", "It was a long time ago, but I still remember ",
]
openers = [
 "This is the story of {s}.", "Nobody in the town could say exactly when it began, but the tale of {s} was told for years afterwards.",
 "Some stories are remembered because they are strange; this one, about {s}, is remembered because it is true.",
 "In the spring of that year, people began to talk about {s}.",
 "My grandmother used to tell us about {s}.",
]
def title(s):
    w = s.split()
    return " ".join(x.capitalize() if i == 0 or len(x) > 3 else x for i, x in enumerate(w))
rows = []
for s in subjects:
    for k in range(5):
        o = openers[k].format(s=s)
        f = forms[(k + len(s)) % len(forms)]
        if f.startswith("It was"):
            p = f + s + ". "
        else:
            p = f.format(T=title(s)) + o + " "
        rows.append(p)
random.shuffle(rows)
with open(sys.argv[1] if len(sys.argv) > 1 else "prompts.jsonl", "w") as out:
    for p in rows:
        out.write(json.dumps({"text": p}) + "\n")
print(len(rows))
