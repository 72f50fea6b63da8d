"""The fast line decoder gives the contract's answers: same records (as events), same reject reasons."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from msgspec import to_builtins as as_record  # an event back to the schema's record

from journal_fixtures import record, step
from nvrx_slo.contracts import schema
from nvrx_slo.contracts.schema import JournalError
from nvrx_slo.exporter.events import as_event
from nvrx_slo.exporter.ingest.decode import decode_batch

VALID = [step(1, 10.0, 1), record("process_start", 0, 5.0, world_size=2),
         record("process_start", 0, 5.0, world_size=2, local_world_size=2, max_restarts=3),
         record("launcher_exit", 3, 9.0, rank=None, code=0),
         record("checkpoint_end", 4, 8.0, ckpt="c1", step=3, ok=True, written=7.5, error=None)]

values = st.one_of(st.none(), st.booleans(), st.integers(-2**53, 2**53), st.text(max_size=5),
                   st.floats(allow_nan=False, allow_infinity=False), st.lists(st.integers(), max_size=2))


@st.composite
def lines(draw) -> bytes:
    rec = dict(draw(st.sampled_from(VALID)))
    for _ in range(draw(st.integers(0, 2))):
        action = draw(st.sampled_from(["drop", "retype", "add"]))
        key = draw(st.sampled_from(sorted(rec) + ["v", "type", "extra"]))
        if action == "drop":
            rec.pop(key, None)
        else:
            rec[key] = draw(values)
    line = schema.encode(rec)[:-1]
    if draw(st.integers(0, 9)) == 0:  # cut it short, as a torn write does
        line = line[: draw(st.integers(0, len(line)))]
    return line


def contract(line: bytes) -> object:
    """What the schema makes of a line, less the extra fields it lets writers add and readers ignore,
    with the optional fields it leaves out as ``None``."""
    try:
        record = schema.decode(line)
    except JournalError as exc:
        return exc.reason
    event = schema.EventType(record["type"])
    optional = dict.fromkeys(schema.OPTIONAL_FIELDS.get(event, {}))
    known = {**schema.COMMON_FIELDS, **schema.PAYLOAD_FIELDS[event], **optional}
    return {**optional, **{k: v for k, v in record.items() if k in known}}


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(lines(), st.sampled_from([b'{"v":1,"type":[]}', b"[1]", b"1,2", b'{"a":1},{"b":2}', b"nul",
                                                    b"{}", b'"x"'])),
                min_size=1, max_size=8))
def test_batch_decoding_matches_the_schema_line_by_line(batch):
    got = [item.reason if isinstance(item, JournalError) else as_record(item) for item in decode_batch(batch)]
    assert got == [contract(line) for line in batch]


def test_events_read_like_records_and_ignore_extra_fields():
    line = schema.encode({**step(7, 10.0, 3), "extra": [1]})[:-1]
    [event] = decode_batch([line])
    assert (event.type, event.seq, event.step, event.start) == ("step", 7, 3, pytest.approx(9.9))
    assert as_record(event) == {**step(7, 10.0, 3), "blocked_s": None}  # optional, left out


def test_a_record_built_in_code_is_checked_by_the_contract():
    assert as_record(as_event(VALID[1])) == {**VALID[1], "local_world_size": None, "max_restarts": None}  # optional
    assert as_record(as_event(VALID[2])) == VALID[2]
    with pytest.raises(JournalError) as bad:
        as_event({**VALID[2], "local_world_size": "2"})
    assert bad.value.reason is schema.RejectReason.BAD_FIELD
    with pytest.raises(JournalError) as missing:
        as_event({k: v for k, v in VALID[1].items() if k != "world_size"})
    assert missing.value.reason is schema.RejectReason.MISSING_FIELD


def test_nan_is_malformed_not_a_number():
    line = schema.encode(step(1, 10.0, 1)).replace(b'"mono":10.0', b'"mono":NaN')[:-1]
    [item] = decode_batch([line])
    assert isinstance(item, JournalError) and item.reason is schema.RejectReason.MALFORMED


def test_lines_a_json_stream_would_read_as_other_lines_are_decoded_one_by_one():
    """The batch is decoded as a stream of JSON values, where one value may span two lines or two
    share one: a batch whose value count still matches its line count must give each line its own answer."""
    one = schema.encode(VALID[0])[:-1]
    for batch in ([one + one, b" "], [one + b" " + one, b"\t", one],
                  [one[:-1] + b",", b'"extra":1}', one + one], [one + b"\r", one, b" "]):
        got = [item.reason if isinstance(item, JournalError) else as_record(item) for item in decode_batch(batch)]
        assert got == [contract(line) for line in batch]
        assert any(isinstance(item, JournalError) for item in decode_batch(batch))
