"""Texts for the tokenizer parity fixture (tokenizer_parity.py): hand-picked hard cases, a sample
of the LLaMA-Factory demo data, and seeded random strings over a deliberately nasty alphabet."""
import json
import random
from pathlib import Path


def tricky_texts():
    texts = [
        "", " ", "  ", "\n", "\n\n\n", "\r\n", "\r\n\r\n", "\t", " \t \n ", "a", "Hello world",
        "Hello world!", " Hello", "Hello ", "Hello  world   ", "trailing spaces   ", "   leading spaces",
        "The quick brown fox jumps over the lazy dog.",
        "It's, you're, we've, I'm, they'll, he'd, isn't", "IT'S YOU'RE WE'VE I'M THEY'LL HE'D",
        "It'S yOu'Re 'll 'LL 'Ll 's's'", "don't 'twas o'clock rock'n'roll", "’s curly ’t apostrophe ’re",
        "long ſ: it'ſ (U+017F folds to s)", "Kelvin K and 'K",
        "1", "12", "123", "1234", "12345678901234567890", "3.14159", "1,000,000", "-42", "0x1F600",
        "phone 555-123-4567 year 2024", "١٢٣٤٥ Arabic-Indic digits", "१२३४ Devanagari digits", "½ ⅓ ² ³ Ⅻ",
        "你好，世界！今天天气很好。", "中文和English混合text。", "日本語のテキストです。カタカナ、ひらがな。",
        "한국어 텍스트입니다. 안녕하세요!", "مرحبا بالعالم! هذا نص عربي.", "नमस्ते दुनिया! यह हिंदी है।",
        "Привет, мир! Это русский текст.", "Γειά σου Κόσμε", "שלום עולם", "ไทย ภาษาไทย", "Tiếng Việt có dấu",
        "emoji 😀😃😄 and more 🎉🎊", "family 👨‍👩‍👧‍👦 zwj", "skin tones 👋🏻👋🏼👋🏽👋🏾👋🏿", "flags 🇺🇸🇯🇵🇫🇷",
        "keycap 1️⃣ #️⃣", "❤️ vs ❤", "🏳️‍🌈 rainbow", "🧑🏽‍💻 coder",
        "e\u0301 vs \u00e9", "A\u030a vs \u00c5 vs \u212b", "\u1e9b\u0323", "ﬁ ligature ﬀ", "Ǆ ǅ ǆ", "Å Ω ℃",
        "\u0915\u093c vs \u0958", "\uac00 \u1100\u1161 hangul jamo", "ḱṷṓn", "Ｆｕｌｌｗｉｄｔｈ ＡＢＣ １２３",
        "nbsp\u00a0here", "thin\u2009space", "ideographic\u3000space", "zero\u200bwidth", "line\u2028sep",
        "para\u2029sep", "nel\u0085char", "mongolian\u180evowel", "bom\ufeffinside", "tab\tand\vvt\fff",
        "def foo(x):\n    return x + 1\n", "if (a) {\n\tb();\n}\n", "  \t  mixed\t \t indentation\n",
        "for i in range(10):\n\tprint(i)\n\n\n", "x = {'a': [1, 2, 3]}  # comment",
        "<html><body><p>Hi &amp; bye</p></body></html>", "SELECT * FROM t WHERE id=1;",
        "https://example.com/path?q=1&r=2#frag", "user@example.com", "C:\\Windows\\System32",
        "$$ \\frac{a}{b} $$", "a+b=c; a-b=d; a*b=e; a/b=f", "!!!???...,,,", "----====____", "~~~```",
        "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n", "<|endoftext|>", "<|endoftext|><|endoftext|>",
        "text<|endoftext|>more", "<|begin_of_text|>Hello", "<|begin_of_text|><|start_header_id|>system<|end_header_id|>",
        "<|eot_id|>", "<|im_start|", "<|im_start|>>", "<<|im_end|>", "< |im_start|>", "<think>\nhmm\n</think>",
        "<tool_call>{}</tool_call>", "<|reserved_special_token_5|>", "<s> </s> <pad> <mask>", "a <mask> b",
        "a   <mask>   b", "x <r>   y", "<r>\n\nz", "ab abc cab ab", "(ab) ab_ _ab ab1", "[Norm] [norm] [NORM]",
        "<tool> spaced  spaced", "[NormTok] [normtok] RAW raw Ǆemo ǅemo word words sword", "x<|eot|>y",
        "a::b::c", "x.y,z;w!v?u", "axbxcx", "xxx", "mix123abc456", "Qq quick", "  Strip me  ",
        "a" * 300, "ab" * 200, "🙂" * 50, "你" * 100, "1" * 100, " " * 300, "\n" * 50, "\t" * 20, "x\n" * 30,
        "supercalifragilisticexpialidocious" * 5, "Pneumonoultramicroscopicsilicovolcanoconiosis",
        "AAAA BBBB CCCC dddd eeee", "camelCaseIdentifier snake_case_identifier SCREAMING_CASE",
        "mixed scripts: Hello你好こんにちは안녕Привет مرحبا",
        "\ufffd replacement char", "\U0001F600\U0001F601", "\U00010000 \U0010FFFF \U000E0001",
        "new letters \u1c89\u1c8a \ua7cb \U000105c0 \U00031350 \U0002ebf0 new digits \U00010d40 \U0001ccf0",
        "Lisu supplement \U00011fb0 Kawi \U00011f04 Nag Mundari \U0001e4d0",
        "<tool> first", " <tool>", "▁already ▁marked", "▁", "a▁b ▁ c", "<tool><tool>x",
    ]
    return texts


def strings_in(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for item in value:
            yield from strings_in(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from strings_in(item)


def corpus_texts(folder, count):
    """`count` strings sampled (seeded) from the LLaMA-Factory demo files; [] when absent."""
    folder = Path(folder)
    if not folder.exists():
        return []
    strings = []
    for path in sorted(folder.glob("*.json")) + sorted(folder.glob("*.jsonl")):
        text = path.read_text(encoding="utf-8")
        docs = [json.loads(line) for line in text.splitlines() if line.strip()] if path.suffix == ".jsonl" \
            else [json.loads(text)]
        strings.extend(s for s in strings_in(docs) if s.strip())
    rng = random.Random(0)
    picked = rng.sample(strings, min(count, len(strings)))
    return [s if len(s) < 4000 else s[:4000] for s in picked]


def repository_texts(repo):
    """Where the shared LLaMA-Factory data is absent (a clone on its own): the repository's own docs,
    sources and test scripts, a line each -- enough text to train an 8000-token tokenizer."""
    texts = []
    for pattern in ("**/*.md", "src/**/*.cpp", "src/**/*.h", "tests/**/*.py"):
        for path in sorted(Path(repo).glob(pattern)):
            if "build" in path.parts or ".venv" in path.parts:
                continue
            texts.extend(line for line in path.read_text(encoding="utf-8").splitlines() if line.strip())
    return texts


def random_texts(count, seed):
    """Random strings over an alphabet of things tokenizers trip on."""
    pieces = [" ", "  ", "\n", "\r\n", "\t", "\u00a0", "\u3000", "'", "'s", "'T", "'re", "'LL", "ſ", "a", "Z",
              "é", "e\u0301", "\u0301", "ß", "İ", "ǅ", "ﬁ", "1", "23", "456", "٣", "½", "你", "好", "の", "한",
              "ع", "न", "\u093c", "😀", "👍🏽", "\u200d", "\ufe0f", "🇫🇷", ".", ",", "!", "?", "-", "_", "(",
              ")", "{", "}", "<", ">", "|", "<|", "|>", "<|im_start|>", "<|endoftext|>", "<|begin_of_text|>",
              "<mask>", "<r>", "ab", "[Norm]", "::", "x", "RAW", "word", "\u1c89", "\U00031350", "\U00010d40",
              "\u180e", "\u0085", "\u2028", "\x00", "\x7f", "\ud7ff", "\ue000", "\U0010ffff", "Hello", "world"]
    rng = random.Random(seed)
    texts = []
    for _ in range(count):
        n = rng.randint(1, 40)
        parts = []
        for _ in range(n):
            if rng.random() < 0.1:
                parts.append(chr(rng.choice([rng.randint(0x20, 0x7e), rng.randint(0xa0, 0x2fff),
                                             rng.randint(0x3000, 0xd7ff), rng.randint(0xe000, 0x10ffff)])))
            else:
                parts.append(rng.choice(pieces))
        texts.append("".join(parts))
    return texts
