"""Prints the code-point ranges that Hugging Face `tokenizers` (Oniguruma, Unicode 16) puts in
\\p{L} and \\p{N} but Unicode 14 does not (Debian 12's PCRE2 10.42 and Python 3.11 both have
Unicode 14). src/data/regex.cpp adds these ranges to \\p{L} / \\p{N} so that pre-tokenizer
splits match HF for newly assigned characters too. Regenerate if either side's Unicode changes:

    build/pyref/.venv/bin/python tests/data/tokenizer_unicode_gap.py
"""
import unicodedata

from tokenizers import Regex, pre_tokenizers


def hf_matches(pattern, chars):
    split = pre_tokenizers.Split(Regex(pattern), behavior="removed")
    kept = set("".join(piece for piece, _ in split.pre_tokenize_str("".join(chars))))
    return {ord(c) for c in chars if c not in kept}


def ranges(points):
    out = []
    for c in sorted(points):
        if out and out[-1][1] == c - 1:
            out[-1][1] = c
        else:
            out.append([c, c])
    return out


def main():
    chars = [chr(c) for c in range(1, 0x110000) if not 0xD800 <= c <= 0xDFFF]
    print(f"// Unicode {unicodedata.unidata_version} (local) vs Hugging Face tokenizers")
    for prop in ("L", "N"):
        hf = hf_matches(r"\p{%s}" % prop, chars)
        local = {ord(c) for c in chars if unicodedata.category(c).startswith(prop)}
        extra = ranges(hf - local)
        assert not (local - hf), f"local \\p{{{prop}}} has points HF lacks: {sorted(local - hf)[:10]}"
        body = "".join(f"\\\\x{{{a:x}}}-\\\\x{{{b:x}}}" if a != b else f"\\\\x{{{a:x}}}" for a, b in extra)
        print(f'constexpr const char* k_extra_{prop} = "{body}";')


if __name__ == "__main__":
    main()
