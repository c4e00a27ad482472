"""core.terminal.printable, the one function between untrusted text and a terminal (issue 40.4).

Property tests: whatever the input, nothing a terminal obeys is left (no C0 but tab and
newline, no DEL, no C1, no bidi override, no lone surrogate), a second pass changes
nothing, text without controls is left as it is, and text with well-formed sequences
between its words comes out as exactly its words (the sequence goes whole, not just its
ESC). The time it takes is measured by benchmarks/scrubber.py.
"""

from __future__ import annotations

import io
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from dstui.core.terminal import FilteredStream, printable

LEFT = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
HOSTILE_CHARS = st.sampled_from(list("\x1b\x07\x9b\x9d\x9c\r\n\t\x00\x7f\u202e\u2066[]];\\P^_X0m2J") + ["\ud800"])
ANY_TEXT = st.text(st.one_of(st.characters(codec=None), HOSTILE_CHARS), max_size=200)
SAFE = st.text(st.characters(blacklist_categories=("Cc", "Cs", "Cf")), max_size=12)
# well-formed sequences, each ending where a terminal ends it
SEQUENCES = st.one_of(
    st.builds(lambda p, f: f"\x1b[{p}{f}", st.from_regex(r"[0-9;?]{0,6}", fullmatch=True), st.sampled_from("mHJKABCDsuhl")),
    st.builds(lambda b, end: f"\x1b]{b}{end}", st.from_regex(r"[0-9]{1,2};[ -~]{0,20}", fullmatch=True).filter(lambda s: "\x1b" not in s),
              st.sampled_from(["\x07", "\x1b\\", "\x9c"])),
    st.builds(lambda k, b: f"\x1b{k}{b}\x1b\\", st.sampled_from("P_^X"), st.from_regex(r"[ -~]{0,20}", fullmatch=True)),
    st.sampled_from(["\x1bc", "\x1b7", "\x1b8", "\x1b(B", "\x1b)0", "\x9b2J", "\x9d0;t\x07", "\x07", "\x00", "\x7f", "\u202e"]),
)  # fmt: skip


@settings(max_examples=500, deadline=None)
@given(ANY_TEXT, st.booleans())
def test_nothing_a_terminal_obeys_is_left_and_a_second_pass_changes_nothing(text: str, one_line: bool) -> None:
    out = printable(text, one_line=one_line)
    assert LEFT.search(out) is None
    assert printable(out, one_line=one_line) == out
    if one_line:
        assert "\n" not in out and "\t" not in out


@settings(max_examples=500, deadline=None)
@given(SAFE)
def test_text_without_controls_is_left_as_it_is(text: str) -> None:
    assert printable(text) == text == printable(text, one_line=True)


@settings(max_examples=500, deadline=None)
@given(st.lists(st.tuples(SAFE, SEQUENCES), max_size=8), SAFE)
def test_sequences_go_whole_and_the_words_around_them_stay(parts: list[tuple[str, str]], tail: str) -> None:
    text = "".join(word + seq for word, seq in parts) + tail
    assert printable(text) == "".join(word for word, _ in parts) + tail


def test_the_issues_reason_line() -> None:
    reason = "Python: RuntimeError: boom \x1b]0;TITLE\x07 \x1b[31mred\x1b[0m \x1b]52;c;aGk=\x07\x1b[2J end\r over"
    assert printable(reason, one_line=True) == "Python: RuntimeError: boom  red  end  over"
    assert printable(reason) == "Python: RuntimeError: boom  red  end\n over"
    assert printable("a\r\nb\rc\x0bd\x0ce") == "a\nb\ncde"
    assert printable("unterminated \x1b]0;title never ends") == "unterminated 0;title never ends"  # its introducer gone, the text kept
    assert printable(b"\xffname".decode(errors="surrogateescape")) == "\ufffdname"
    assert printable(12) == "12"


def test_the_stream_passes_only_printable_text() -> None:
    inner = io.StringIO()
    stream = FilteredStream(inner, printable)
    assert stream.write("ok \x1b[2Jcleared\x07\n") == len("ok \x1b[2Jcleared\x07\n")
    stream.write('{"reason": "\\u001b]0;t\\u0007"}\n')  # JSON escapes control characters: left alone
    assert inner.getvalue() == 'ok cleared\n{"reason": "\\u001b]0;t\\u0007"}\n'
    assert stream.getvalue() == inner.getvalue()  # everything else is the wrapped stream's
