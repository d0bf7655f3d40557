"""trace/dump/codec: an event and its tensors as JSON and back, as dumps and saved results write them."""

import json
from pathlib import Path

import numpy as np
import pytest

from nbdiff.errors import DumpError
from nbdiff.trace.dump.codec import event_from_json, event_json, json_float, load_dump_json, read_float
from tests.dumps import small_events


def test_an_event_survives_json_with_its_values_by_key_and_its_non_finite_statistics():
    (event,) = small_events()
    payload: dict[str, np.ndarray] = {}
    written = json.loads(json.dumps(event_json(event, payload, keep_values=True, keep_stats=True)))
    back = event_from_json(written, 0, payload, Path("step0.json"))
    assert (back.path, back.type_name, back.args, back.stack) == (event.path, event.type_name, event.args, event.stack)
    np.testing.assert_array_equal(back.outputs[0].value, event.outputs[0].value)
    assert back.inputs[0].stats is not None and back.inputs[0].stats.nan == 1 and back.inputs[0].stats.inf == 1
    assert json_float(float("inf")) == "inf" and read_float("nan") != read_float("nan") and json_float(1.5) == 1.5


def test_statistics_only_keep_no_values_and_a_missing_payload_key_names_the_file(tmp_path):
    (event,) = small_events()
    payload: dict[str, np.ndarray] = {}
    written = event_json(event, payload, keep_values=False, keep_stats=True)
    assert payload == {} and event_from_json(written, 0, payload, tmp_path).outputs[0].value is None
    kept = event_json(event, payload, keep_values=True, keep_stats=False)
    with pytest.raises(DumpError, match="missing from its payload file"):
        event_from_json(kept, 0, {}, tmp_path / "step0.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(DumpError, match="bad.json: not valid JSON"):
        load_dump_json(tmp_path / "bad.json", "an nbdiff manifest")
