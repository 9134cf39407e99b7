"""A RULER-style synthetic long-context suite, generated here, seeded and deterministic.

Our own code of the task types of RULER (Hsieh et al., 2024, "RULER: What's the Real Context Size
of Your Long-Context Language Models?"): needle-in-a-haystack with one or several keys (values are
numbers, words or UUID-like strings), several values for one key, variable tracking through
chained assignments, common-word extraction, and a records lookup (a one-line table).

Each item is a context, a question that ends in "Answer:", and the gold answer(s). The context is
filled (haystack sentences, list entries or records) until context plus question reach the target
length in tokens of the given tokenizer, without passing it. Answers are short enough for a
16-token greedy answer with SmolLM2's tokenizer (digits are single tokens there).

Scoring (RULER's "string match all"): the prediction and each gold are normalised (lower case,
whitespace collapsed); an item's score is the share of golds that occur in the prediction as whole
words; it is correct when all do.
"""

from __future__ import annotations

import random
import re
import string
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

# ---- vocabulary ----------------------------------------------------------------------------------
# The filler words, the needle keys, the needle values and the common words of the CWE task are
# disjoint lists, so a key or a value never occurs in the haystack by chance.
_ADJ = tuple(
    "quiet old tall busy gentle distant narrow bright heavy small calm green patient early wide "
    "silent warm young broad plain".split()
)
_NOUN = tuple(
    "farmer river market teacher bridge village garden road baker harbor forest painter valley "
    "library sailor field tower merchant hill school".split()
)
_VERB = tuple(
    "walked past|looked at|waited near|spoke about|rested by|passed|painted|visited|cleaned|described".split("|")
)
_TIME = tuple(
    "at dawn|in the evening|before noon|after the rain|every spring|on a Sunday|during the fair|late at night|"
    "in winter|after lunch".split("|")
)
_KEY_ADJ = tuple(
    "dapper crimson wobbly fierce velvet jagged lucky frosty hollow amber brisk cobalt dusty eager "
    "gilded hasty ivory jolly keen lunar".split()
)
_KEY_NOUN = tuple(
    "lantern walrus compass teapot falcon anchor violin cactus saddle comet beacon thimble kettle "
    "otter quill pebble raven spindle tulip wagon".split()
)
_VALUE_WORDS = tuple(
    "apple copper window orange candle silver rabbit marble pencil ribbon button mirror carpet basket "
    "guitar ladder island rocket pillow castle dragon jacket lemon monkey needle planet hammer tiger "
    "wallet zebra".split()
)
_COMMON = tuple("cloud stone paper music horse sugar chair money water light bread glass night voice grass".split())
_GOODS = ("copper", "grain", "timber", "cotton", "salt", "coal", "wool", "glass", "rice", "steel")
_CONSONANTS, _VOWELS = "bdfgklmnprstvz", "aeiou"

NEEDLE = "One of the special magic {kind} for {key} is: {value}."
NIAH_INTRO = (
    "Some special magic {kinds} are hidden within the following text. Make sure to memorize them. "
    "I will quiz you about the {kinds} afterwards.\n"
)


@dataclass(frozen=True, slots=True)
class Item:
    """One question of the suite.

    Attributes:
        task: the task name (a key of :data:`TASKS`).
        length: the target length in tokens (context + question).
        index: the item's number within its task and length.
        seed: the suite seed it was drawn with.
        context: the text before the question (tokenized with the BOS token).
        question: the question, ending in "Answer:" or, with ``prefix``, in the task's answer prefix after it
            (tokenized without special tokens, appended).
        answers: the gold answers; all must occur in a correct prediction.
        tokens: len(context ids) + len(question ids) with the tokenizer it was built for.
    """

    task: str
    length: int
    index: int
    seed: int
    context: str
    question: str
    answers: tuple[str, ...]
    tokens: int

    def score(self, prediction: str) -> float:
        """The share of gold answers that occur in ``prediction`` (normalised, as whole words)."""
        return score(prediction, self.answers)

    def correct(self, prediction: str) -> bool:
        """True when every gold answer occurs in ``prediction``."""
        return self.score(prediction) == 1.0

    def to_dict(self) -> dict:
        return asdict(self) | {"answers": list(self.answers)}


# ---- scoring --------------------------------------------------------------------------------------
def normalise(text: str) -> str:
    """Lower case, whitespace collapsed to single spaces, trimmed."""
    return " ".join(text.lower().split())


def contains(prediction: str, gold: str) -> bool:
    """``gold`` occurs in ``prediction`` (both normalised) not inside a longer word or number."""
    pattern = r"(?<![0-9a-z])" + re.escape(normalise(gold)) + r"(?![0-9a-z])"
    return re.search(pattern, normalise(prediction)) is not None


def score(prediction: str, answers: Sequence[str]) -> float:
    """The share of ``answers`` contained in ``prediction`` (RULER's string match all)."""
    if not answers:
        raise ValueError("an item needs at least one gold answer")
    return sum(contains(prediction, a) for a in answers) / len(answers)


# ---- random pieces ---------------------------------------------------------------------------------
def _number(rng: random.Random, digits: int = 7) -> str:
    return str(rng.randrange(10 ** (digits - 1), 10**digits))


def _uuid(rng: random.Random) -> str:
    """An 8-4 hex string (a UUID's first two groups: a full UUID is ~30 SmolLM2 tokens)."""
    hexdig = "0123456789abcdef"
    return "".join(rng.choice(hexdig) for _ in range(8)) + "-" + "".join(rng.choice(hexdig) for _ in range(4))


def _keys(rng: random.Random, n: int) -> list[str]:
    """``n`` distinct word keys ("dapper-lantern")."""
    pairs = rng.sample([(a, b) for a in _KEY_ADJ for b in _KEY_NOUN], n)
    return [f"{a}-{b}" for a, b in pairs]


def _pseudo_word(rng: random.Random) -> str:
    return "".join(rng.choice(_CONSONANTS) + rng.choice(_VOWELS) for _ in range(rng.randint(2, 3)))


def _var_name(rng: random.Random) -> str:
    return "".join(rng.choice(string.ascii_uppercase) for _ in range(4))


def _filler(rng: random.Random, n: int) -> list[str]:
    """``n`` haystack sentences ("The quiet farmer walked past the old bridge at dawn.")."""
    out = []
    for _ in range(n):
        a, b = rng.sample(_ADJ, 2)
        s, o = rng.sample(_NOUN, 2)
        out.append(f"The {a} {s} {rng.choice(_VERB)} the {b} {o} {rng.choice(_TIME)}.")
    return out


def _insert(sentences: list[str], inserts: list[tuple[float, str]]) -> str:
    """The sentences joined by spaces with each insert placed at its depth (0 = start, 1 = end), in depth order."""
    out = list(sentences)
    for depth, text in sorted(inserts, key=lambda x: x[0], reverse=True):
        out.insert(round(depth * len(sentences)), text)
    return " ".join(out)


# ---- tasks: builder(rng, n) -> (context, question, answers); n = filler units -------------------------
Built = tuple[str, str, tuple[str, ...]]


def _niah(kind: str, value: Callable[[random.Random], str], needles: int = 1, uuid_keys: bool = False):
    """Needle in a haystack: ``needles`` needles of distinct keys; the question asks one of them."""

    def build(rng: random.Random, n: int) -> Built:
        keys = [_uuid(rng) for _ in range(needles)] if uuid_keys else _keys(rng, needles)
        values = [value(rng) for _ in keys]
        depths = [rng.random() for _ in keys]
        asked = rng.randrange(needles)
        inserts = [(d, NEEDLE.format(kind=kind, key=k, value=v)) for d, k, v in zip(depths, keys, values, strict=True)]
        context = NIAH_INTRO.format(kinds=kind + "s") + _insert(_filler(rng, n), inserts) + "\n"
        question = f"What is the special magic {kind} for {keys[asked]} mentioned in the provided text? Answer:"
        return context, question, (values[asked],)

    return build


def _multivalue(values: int = 3):
    """One key, ``values`` needles with a word value each; all are asked."""

    def build(rng: random.Random, n: int) -> Built:
        key = _keys(rng, 1)[0]
        words = rng.sample(_VALUE_WORDS, values)
        inserts = [(rng.random(), NEEDLE.format(kind="word", key=key, value=w)) for w in words]
        context = NIAH_INTRO.format(kinds="words") + _insert(_filler(rng, n), inserts) + "\n"
        question = f"What are all the special magic words for {key} mentioned in the provided text? Answer:"
        return context, question, tuple(words)

    return build


def _variable_tracking(hops: int = 2, chains: int = 2):
    """Chains of assignments (VAR A = 12345. VAR B = VAR A. ...) in the haystack, in order; the
    question asks every variable of the first chain (the others are distractors with other values)."""

    def build(rng: random.Random, n: int) -> Built:
        names: list[str] = []
        while len(names) < chains * (hops + 1):
            name = _var_name(rng)
            if name not in names:
                names.append(name)
        values = rng.sample(range(10000, 100000), chains)
        inserts = []
        for c in range(chains):
            chain = names[c * (hops + 1) : (c + 1) * (hops + 1)]
            depths = sorted(rng.random() for _ in chain)
            inserts.append((depths[0], f"VAR {chain[0]} = {values[c]}."))
            inserts += [(d, f"VAR {b} = VAR {a}.") for d, a, b in zip(depths[1:], chain[:-1], chain[1:], strict=True)]
        context = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n"
        context += _insert(_filler(rng, n), inserts) + "\n"
        question = f"Find all variables that are assigned the value {values[0]} in the text above. Answer:"
        return context, question, tuple(names[: hops + 1])

    return build


def _common_words(top: int = 3):
    """A numbered list of ``n`` words: ``top`` common words repeated often, the rest rare pseudo-words
    (1-3 times each); the question asks the ``top`` most common."""

    def build(rng: random.Random, n: int) -> Built:
        common = rng.sample(_COMMON, top)
        reps = max(6, n // (4 * top))  # the common words fill about a quarter of the list
        words = [w for w in common for _ in range(reps)]
        while len(words) < n:
            word = _pseudo_word(rng)
            words += [word] * min(rng.randint(1, 3), n - len(words))
        rng.shuffle(words)
        context = (
            "Below is a numbered list of words. In these words, some appear more often than others. "
            "Memorize the ones that appear most often.\n" + " ".join(f"{i + 1}. {w}" for i, w in enumerate(words))
        ) + "\n"
        question = f"What are the {top} most common words in the above list? Answer:"
        return context, question, tuple(common)

    return build


def _records():
    """``n`` one-line warehouse records (sector numbers repeat, crate counts differ); the question
    names a record and its sector and asks its crate count."""

    def build(rng: random.Random, n: int) -> Built:
        asked = rng.random()
        lines, crates = [], []
        for i in range(1, n + 1):
            sector, count = rng.randint(1, 9), rng.randint(100, 999)
            crates.append((sector, count))
            lines.append(f"Record {i}: the warehouse in sector {sector} holds {count} crates of {rng.choice(_GOODS)}.")
        i = min(n, 1 + int(asked * n))
        sector, count = crates[i - 1]
        context = "Warehouse inventory records, one per line.\n" + "\n".join(lines) + "\n"
        question = f"How many crates does the warehouse in sector {sector} hold in record {i}? Answer:"
        return context, question, (str(count),)

    return build


#: task name -> builder(rng, n) of (context, question, answers)
TASKS: dict[str, Callable[[random.Random, int], Built]] = {
    "niah_single_number": _niah("number", _number),
    "niah_single_word": _niah("word", lambda rng: rng.choice(_VALUE_WORDS)),
    "niah_single_uuid": _niah("uuid", _uuid),
    "niah_multikey": _niah("number", _number, needles=4),
    "niah_multikey_uuid": _niah("uuid", _uuid, needles=4, uuid_keys=True),
    "niah_multivalue": _multivalue(),
    "variable_tracking": _variable_tracking(),
    "common_words": _common_words(),
    "records": _records(),
}


# ---- answer prefixes (RULER's) -------------------------------------------------------------------------
def answer_prefix(task: str, question: str, answers: Sequence[str]) -> str:
    """The text RULER puts after a question so that the model's next tokens are the answer itself
    (RULER's answer prefixes; ours for records): " The special magic number for K mentioned in the
    provided text is", "... 3 variables are assigned the value V, they are:", ... Read off the
    question (its key, value, count) and the number of gold answers. A small model asked "...?
    Answer:" often restates the question or stops at once (SmolLM2-135M: EOS first on multi-value,
    variable tracking and common words); after the prefix it answers."""
    if task.startswith("niah"):
        found = re.search(r"What (is|are all) the special magic (\w+) for (\S+) mentioned", question)
        verb = "are" if found.group(1) == "are all" else "is"
        return f" The special magic {found.group(2)} for {found.group(3)} mentioned in the provided text {verb}"
    if task == "variable_tracking":
        value = re.search(r"assigned the value (\d+)", question).group(1)
        return (
            " According to the chain(s) of variable assignment in the text above, "
            f"{len(answers)} variables are assigned the value {value}, they are:"
        )
    if task == "common_words":
        top = re.search(r"What are the (\d+) most common", question).group(1)
        return f" The top {top} words that appear most often in the list are:"
    if task.startswith("records"):
        sector, record = re.search(r"sector (\d+) hold in record (\d+)\?", question).groups()
        return f" Record {record}: the warehouse in sector {sector} holds"
    raise ValueError(f"no answer prefix for task {task!r}")


# ---- length fitting ----------------------------------------------------------------------------------
def encode(tokenizer, context: str, question: str) -> tuple[list[int], list[int]]:
    """(context ids with the BOS token, question ids without special tokens): the prompt is their concatenation."""
    ctx = tokenizer(context, add_special_tokens=True)["input_ids"]
    return list(ctx), list(tokenizer(question, add_special_tokens=False)["input_ids"])


def make_item(task: str, length: int, index: int, tokenizer, seed: int = 0, prefix: bool = False) -> Item:
    """Item ``index`` of ``task`` at ``length`` tokens: the most filler units whose prompt fits ``length``.

    Deterministic: the item's random stream is seeded by (seed, task, length, index), and every
    probe of the search rebuilds the item from that seed. ``prefix``: the question ends in the
    task's :func:`answer_prefix` after "Answer:" (the same context and gold, maybe fewer filler
    units: the prefix counts in the length).
    """
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; valid: {', '.join(TASKS)}")
    build = TASKS[task]

    def tokens(n: int) -> tuple[int, Built]:
        built = build(random.Random(f"{seed}/{task}/{length}/{index}"), n)
        if prefix:
            built = (built[0], built[1] + answer_prefix(task, built[1], built[2]), built[2])
        ctx, q = encode(tokenizer, built[0], built[1])
        return len(ctx) + len(q), built

    lo, hi = 1, 16  # largest n that fits is in [lo, hi)
    if tokens(lo)[0] > length:
        raise ValueError(f"{task}: length {length} is too short for one filler unit ({tokens(lo)[0]} tokens)")
    while tokens(hi)[0] <= length:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if tokens(mid)[0] <= length else (lo, mid)
    count, (context, question, answers) = tokens(lo)
    return Item(task, length, index, seed, context, question, answers, count)


def make_suite(
    tasks: Sequence[str],
    lengths: Sequence[int],
    items: int,
    tokenizer,
    seed: int = 0,
    prefix: bool = False,
    first: int = 0,
) -> list[Item]:
    """Items ``first`` .. ``items - 1`` of every task at every length (task-major, then length, then
    index); an item depends only on its task, length, index and seed, so runs over disjoint index
    ranges (one per core) together make the suite of ``items`` items."""
    indices = range(first, items)
    return [make_item(t, n, i, tokenizer, seed, prefix) for t in tasks for n in lengths for i in indices]


def records_example(tokenizer, records: int = 240, asked: int = 39, seed: int = 0) -> Item:
    """Issue 24's reproduction, rebuilt: ``records`` one-line warehouse records (the records task's
    lines, seeded) and the question on record ``asked``; about 5,400 SmolLM2 tokens at 240 records.
    Its task is "records_example", its length the prompt's token count."""
    if not 1 <= asked <= records:
        raise ValueError(f"asked={asked} must be a record number in 1..{records}")
    context, _, _ = TASKS["records"](random.Random(f"{seed}/records_example/{records}"), records)
    line = context.split("\n")[asked]
    sector, count = re.search(r"sector (\d+) holds (\d+) crates", line).groups()
    question = f"How many crates does the warehouse in sector {sector} hold in record {asked}? Answer:"
    ctx, q = encode(tokenizer, context, question)
    return Item("records_example", len(ctx) + len(q), 0, seed, context, question, (count,), len(ctx) + len(q))
