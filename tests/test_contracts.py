"""The two contracts: the journal schema and the metric catalogue."""

import subprocess
import sys

import pytest

from nvrx_slo.contracts import catalogue, schema


def _record(**payload):
    base = {"v": 1, "type": "step", "seq": 0, "mono": 10.0, "wall": 1.7e9, "job": "j", "pod": "p",
            "node": "n", "rank": 0, "local_rank": 0, "pid": 42, "restart": 0, "iter": 0}
    return {**base, **payload}


STEP = {"step": 3, "start": 9.5, "data_s": 0.1, "compute_s": 0.3, "optimizer_s": 0.05}


def test_a_valid_record_round_trips():
    line = schema.encode(_record(**STEP))
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert schema.decode(line) == _record(**STEP)


@pytest.mark.parametrize("line, reason", [
    (b'{"v":1,"type":"step"', schema.RejectReason.MALFORMED),
    (b"[1,2]", schema.RejectReason.NOT_AN_OBJECT),
    (schema.encode(_record(v=99, **STEP)), schema.RejectReason.UNKNOWN_VERSION),
    (schema.encode(_record(type="teleport")), schema.RejectReason.UNKNOWN_TYPE),
    (schema.encode(_record(step=1)), schema.RejectReason.MISSING_FIELD),
    (schema.encode(_record(**{**STEP, "step": "three"})), schema.RejectReason.BAD_FIELD),
    (schema.encode(_record(**{**STEP, "step": True})), schema.RejectReason.BAD_FIELD),
    (b"\xff\xfe", schema.RejectReason.MALFORMED),
])
def test_bad_lines_are_rejected_with_their_reason(line, reason):
    with pytest.raises(schema.JournalError) as err:
        schema.decode(line)
    assert err.value.reason is reason


def test_every_event_type_has_a_payload_spec():
    assert set(schema.PAYLOAD_FIELDS) == set(schema.EventType)


def test_catalogue_names_follow_prometheus_conventions():
    names = [m.name for m in catalogue.CATALOGUE]
    assert len(names) == len(set(names))
    for m in catalogue.CATALOGUE:
        assert m.name.startswith("nvrx_")
        assert m.name.endswith("_total") == (m.kind is catalogue.Kind.COUNTER), m.name
        assert bool(m.buckets) == (m.kind is catalogue.Kind.HISTOGRAM), m.name
        assert m.help.endswith("."), m.name


def test_exporter_side_imports_no_torch():
    code = "import nvrx_slo.contracts.catalogue, nvrx_slo.contracts.schema, sys; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
