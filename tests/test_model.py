"""The view's data: tree rows, replay order, and the details of one row, as plain JSON."""

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("paddle")

import nbdiff  # noqa: E402
from nbdiff.view.model import build_tree, node_detail  # noqa: E402
from tests.fault_suite.models import BUILDERS, inputs  # noqa: E402
from tests.structure_models import attention_block  # noqa: E402


@pytest.fixture(scope="module")
def failed():
    return nbdiff.auto_diff(BUILDERS["mlp"]("torch"), BUILDERS["mlp"]("paddle", "eps"), inputs("mlp"))


def test_rows_nest_by_layer_under_one_group_per_phase(failed):
    tree = build_tree(failed)
    groups = [n for n in tree.nodes if n["event"] < 0]
    assert [g["label"] for g in groups] == ["step 0 · forward", "step 0 · backward"]
    for n in tree.nodes:
        assert n["parent"] < n["id"]  # a parent always comes first
        if n["parent"] >= 0:
            assert n["depth"] == tree.nodes[n["parent"]]["depth"] + 1
    fwd = {n["base"]: n for n in tree.nodes if n["phase"] == "forward" and n["event"] >= 0}
    assert tree.nodes[fwd["norm"]["parent"]]["base"] == ""  # under the root model's row
    json.dumps(tree.nodes)  # no inf or numpy scalars: goes over the comm as is


def test_first_divergence_is_marked_and_replay_covers_every_event(failed):
    tree = build_tree(failed)
    first = tree.nodes[tree.first]
    assert (first["base"], first["phase"], first["status"]) == ("norm", "forward", "blamed")
    assert sorted(tree.order) == sorted(n["id"] for n in tree.nodes if n["event"] >= 0)
    fwd_order = [tree.nodes[i]["base"] for i in tree.order if tree.nodes[i]["phase"] == "forward"]
    assert fwd_order[:4] == ["<inputs>", "", "fc1", "norm"]  # the inputs, then execution order, the root first
    statuses = {n["base"]: n["status"] for n in tree.nodes if n["phase"] == "forward"}
    assert statuses["fc1"] == "ok" and statuses["fc2"] == "inherited"


def test_rows_that_compared_nothing_are_not_shown_as_passing(failed):
    # The backward root holds no tensor of its own: a green "0" would claim a check that never ran.
    tree = build_tree(failed)
    root = next(n for n in tree.nodes if n["phase"] == "backward" and n["event"] >= 0 and n["base"] == "")
    assert (root["status"], root["ratio"]) == ("none", None)
    fc1 = next(n for n in tree.nodes if n["phase"] == "backward" and n["base"] == "fc1")
    assert fc1["status"] != "none" and fc1["ratio"] is not None


def test_detail_has_statistics_metrics_and_both_stacks(failed):
    tree = build_tree(failed)
    d = node_detail(tree, tree.first)
    t = d["tensors"][0]
    assert t["metrics"]["name"] == "out" and not t["metrics"]["passed"]
    assert t["local"]["ratio"] > 1
    assert set(t["base"]) >= {"min", "max", "mean", "std", "nan", "inf", "shape", "dtype"}
    assert t["base"]["shape"] == [8, 64]
    assert any(f["file"].endswith("models.py") for f in d["stacks"]["raw"])
    backward = next(n["id"] for n in tree.nodes if n["phase"] == "backward" and n["base"] == "fc1")
    back = node_detail(tree, backward)
    assert {x["metrics"]["name"] for x in back["tensors"]} >= {"weight", "bias"}
    assert back["stacks"]["base"], "backward rows show the stack of their forward call"
    json.dumps(back)


def test_calls_paired_with_nothing_are_shown_under_their_parent():
    result = nbdiff.auto_diff(
        BUILDERS["transformer"]("torch"), BUILDERS["transformer"]("paddle"), inputs("transformer")
    )
    assert result, result.report()
    tree = build_tree(result)
    unpaired = [n for n in tree.nodes if n["status"] == "unpaired"]
    assert {n["raw"] for n in unpaired} == {"attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.out_proj"}
    attn = next(n for n in tree.nodes if n["raw"] == "attn" and n["phase"] == "forward")
    assert all(n["parent"] == attn["id"] and n["event"] == -2 for n in unpaired)
    assert not set(tree.order) & {n["id"] for n in unpaired}
    assert node_detail(tree, unpaired[0]["id"])["tensors"] == []


def test_statistics_only_dumps_show_their_statistics(tmp_path):
    # Regression: the panel computed statistics from values, so a statistics dump showed none.
    from tests.dumps import pair, train

    base, raw = pair("eps")
    a = train(base, tmp_path / "a", steps=1, dump_type="statistics")
    b = train(raw, tmp_path / "b", steps=1, dump_type="statistics")
    tree = build_tree(nbdiff.compare(a.parent, b.parent))
    t = node_detail(tree, tree.first)["tensors"][0]
    assert t["base"]["shape"] == [8, 64] and t["base"]["std"] > 0 and t["raw"]["nan"] == 0
    json.dumps(t)


def test_detail_shows_where_each_side_built_the_layer(failed):
    tree = build_tree(failed)
    detail = node_detail(tree, tree.first)  # norm: LayerNorm(64, 1e-3 if bug == "eps" else 1e-5)
    for side in ("base", "raw"):
        (built,) = detail["stacks"][f"{side}_built"]
        line = open(built["file"]).read().splitlines()[built["line"] - 1]
        assert "self.norm = " in line and built["function"].endswith(".__init__")


def test_a_setting_one_optimizer_lacks_is_not_marked_as_differing_at_its_neutral_value():
    # torch's SGD has momentum 0, paddle's SGD no momentum at all: only the learning rate differs.
    import paddle
    import torch

    tb, pb = BUILDERS["mlp"]("torch"), BUILDERS["mlp"]("paddle")
    opts = [torch.optim.SGD(tb.parameters(), lr=0.1), paddle.optimizer.SGD(0.3, parameters=pb.parameters())]
    result = nbdiff.auto_diff(tb, pb, inputs("mlp"), optimizers=opts, steps=2)
    tree = build_tree(result)
    detail = node_detail(tree, tree.first)
    settings = {s["name"]: s for s in detail["settings"]}
    assert (settings["momentum"]["base"], settings["momentum"]["raw"]) == (0.0, None)
    assert [s["name"] for s in detail["settings"] if s["differs"]] == ["lr"], detail["settings"]


def test_an_update_row_says_update_and_shows_both_optimizers_settings():
    import paddle
    import torch

    tb, pb = BUILDERS["mlp"]("torch"), BUILDERS["mlp"]("paddle")
    opts = [
        torch.optim.AdamW(tb.parameters(), lr=1e-2, weight_decay=0.01),
        paddle.optimizer.AdamW(learning_rate=1e-2, parameters=pb.parameters(), weight_decay=0.1),
    ]
    result = nbdiff.auto_diff(tb, pb, inputs("mlp"), optimizers=opts, steps=2)
    tree = build_tree(result)
    assert tree.nodes[tree.first]["phase"] == "optimizer"
    detail = node_detail(tree, tree.first)
    assert all(t["metrics"]["name"].startswith("update of ") for t in detail["tensors"])
    settings = {s["name"]: s for s in detail["settings"]}
    assert (settings["weight_decay"]["base"], settings["weight_decay"]["raw"]) == (0.01, 0.1)
    assert settings["weight_decay"]["differs"] and not settings["lr"]["differs"]
    assert [s["name"] for s in detail["settings"] if s["differs"]] == ["weight_decay"]
    json.dumps(detail["settings"])
    # Every parameter's own update error is an own error in the tree (the 'own error' filter lists it),
    # not "inherited": the weight decay differs for each of them. A saved and loaded result reads the same.
    _every_update_finding_is_own(result)


def _every_update_finding_is_own(result):
    tree = build_tree(result)
    updates = {f.base_path for f in result.findings if f.phase.value == "optimizer"}
    assert len(updates) > 1
    rows = {n["base"]: n for n in tree.nodes if n["phase"] == "optimizer" and n["step"] == 0 and n["event"] >= 0}
    for path in updates:
        assert rows[path]["status"] in ("blamed", "local") and rows[path]["local"] > 1, path
    group = next(n for n in tree.nodes if n["event"] == -1 and n["phase"] == "optimizer" and n["step"] == 0)
    assert group["status"] == "local"


def test_a_loaded_result_marks_every_own_update_error(tmp_path):
    import paddle
    import torch

    tb, pb = BUILDERS["cnn"]("torch"), BUILDERS["cnn"]("paddle")
    opts = [
        torch.optim.AdamW(tb.parameters(), lr=1e-2, weight_decay=0.01),
        paddle.optimizer.AdamW(learning_rate=1e-2, parameters=pb.parameters(), weight_decay=0.1),
    ]
    result = nbdiff.auto_diff(tb, pb, inputs("cnn"), optimizers=opts, steps=1)
    _every_update_finding_is_own(result)
    _every_update_finding_is_own(nbdiff.load(result.save(str(tmp_path / "saved"))))


def test_a_result_that_agrees_draws_inherited_excess_as_explained_and_says_why():
    # An equivalent ShuffleNetV2 port: a few rows exceed their tolerance by inherited rounding only.
    # The view must not show orange in a SUCCESS, and result.warnings says what those rows are.
    import nbdiff
    from nbdiff.view.model import build_tree
    from tests.zoo.pairs import shufflenet

    base, raw, x, _ = shufflenet()()
    result = nbdiff.auto_diff(base, raw, x)
    assert result, result.report()
    statuses = {n["status"] for n in build_tree(result).nodes}
    assert "inherited" not in statuses and "explained" in statuses
    assert any("exceed their tolerance only by error inherited" in w for w in result.warnings)


def test_the_panel_says_how_a_local_error_was_found(failed, tmp_path):
    # Offline nothing is re-run: "local (same inputs)" said what compare never did. Live, the words say
    # what was done: the call run alone on base's inputs.
    from tests.dumps import pair, train

    first = node_detail(build_tree(failed), build_tree(failed).first)
    assert first["tensors"][0]["local_label"] == "run alone on base's inputs"
    base, raw = pair("eps")
    offline = nbdiff.compare(train(base, tmp_path / "a", steps=1).parent, train(raw, tmp_path / "b", steps=1).parent)
    tree = build_tree(offline)
    assert node_detail(tree, tree.first)["tensors"][0]["local_label"] == "rebuilt from the dump, on base's inputs"
    a = train(base, tmp_path / "c", steps=1, dump_type="statistics").parent
    tree = build_tree(nbdiff.compare(a, train(raw, tmp_path / "d", steps=1, dump_type="statistics").parent))
    assert node_detail(tree, tree.first)["tensors"][0]["local_label"].startswith("not measured, judged from the dump")


@pytest.fixture(scope="module", params=["torch->paddle", "paddle->torch"])
def code_blame(request):
    base_fw, raw_fw = request.param.split("->")
    base, x = attention_block(base_fw)
    raw, _ = attention_block(raw_fw, wide_scale=True)
    return nbdiff.auto_diff(base, raw, x)


def test_a_code_blame_shows_the_tensor_that_carries_its_local_error_first(code_blame):
    """The row reads `(local 1e3)`; the panel opens on the tensor behind that number (what the block's
    code handed `proj`, run on base's inputs), with both sides' statistics and its error picture."""
    d = code_blame.first_divergence
    assert d.where == "between" and d.between == ("qkv", "proj")
    tree = build_tree(code_blame)
    row = tree.nodes[tree.first]
    detail = node_detail(tree, tree.first)
    first = detail["tensors"][0]
    assert first["name"] == "proj:in[0]" == d.local_error.name
    assert first["local"]["ratio"] == pytest.approx(row["local"]) and not first["local"]["passed"]
    assert "handed `proj`" in first["what"]
    for side in ("base", "raw"):
        assert first[side]["shape"] == [2, 5, 16] and first[side]["std"] > 0
    assert detail["picture"] is not None and not detail["picture"]["passed"]
    assert sum(detail["picture"]["counts"]) == 2 * 5 * 16
    # Only failing evidence is listed: the sublayers handed the same values are not.
    assert [t["name"] for t in detail["tensors"] if t["metrics"] is None] == ["proj:in[0]"]
    # The block's outputs carry no local block of their own: it read "local 0x" under "local 1e3".
    assert [t["local"] for t in detail["tensors"] if t["metrics"] is not None] == [None]
    # The matplotlib figure of the blamed tensor is the same tensor's.
    assert code_blame.plot_divergence() is not None


def test_a_code_blame_frame_opens_on_the_lines_between_the_two_sublayers(code_blame):
    import inspect

    tree = build_tree(code_blame)
    stacks = node_detail(tree, tree.first)["stacks"]
    source, start = inspect.getsourcelines(attention_block)
    qkv_line = start + next(i for i, s in enumerate(source) if "self.qkv(self.ln(x))" in s)
    proj_line = start + next(i for i, s in enumerate(source) if "self.proj(merge(" in s)
    for side in ("base", "raw"):
        inside = stacks[side][0]
        assert (inside["function"], inside["first"], inside["line"]) == ("forward", qkv_line, proj_line)
        assert inside["label"] == f"structure_models.py:{qkv_line}-{proj_line}"
    # The report's stacks begin inside the block's code too.
    assert code_blame.first_divergence.base_stack[0].lineno == proj_line


def test_a_code_blame_under_single_step_shows_both_sides_of_what_the_code_computed():
    base, x = attention_block("torch")
    raw, _ = attention_block("paddle", wide_scale=True)
    result = nbdiff.auto_diff(base, raw, x, single_step=True)
    tree = build_tree(result)
    detail = node_detail(tree, tree.first)
    first = detail["tensors"][0]
    assert first["name"] == "proj:in[0]" and first["metrics"]["ratio"] > 1
    assert first["base"]["mean"] != first["raw"]["mean"]  # base's input to proj, raw's own code's
    assert detail["picture"] is not None
    proj = next(n["id"] for n in tree.nodes if n["base"] == "proj" and n["phase"] == "forward")
    given = next(t for t in node_detail(tree, proj)["tensors"] if t["name"] == "given:in[0]")
    assert given["base"] is not None and given["raw"] is not None


def test_a_saved_code_blame_keeps_its_evidence(code_blame, tmp_path):
    loaded = nbdiff.load(code_blame.save(str(tmp_path / "saved")))
    tree = build_tree(loaded)
    detail = node_detail(tree, tree.first)
    assert detail["tensors"][0]["name"] == "proj:in[0]" and detail["tensors"][0]["raw"] is not None
    assert detail["picture"] is not None


def test_a_scalar_gets_no_error_map(failed):
    tree = build_tree(failed)
    loss = next(n["id"] for n in tree.nodes if n["label"] == "<loss>")
    assert node_detail(tree, loss)["picture"] is None


def test_a_group_rows_panel_summarises_its_step(failed):
    """A chart click selects a step's group row: its panel gives the step at a glance (it had a title
    and two empty stack headings), each worst row a link to select."""
    tree = build_tree(failed)
    group = next(n for n in tree.nodes if n["event"] == -1 and n["phase"] == "forward")
    detail = node_detail(tree, group["id"])
    summary = detail["step"]
    forward = next(p for p in summary["phases"] if p["phase"] == "forward")
    assert forward["own"] >= 1 and forward["worst"][0]["id"] == tree.first
    assert tree.nodes[forward["worst"][0]["id"]]["base"] == forward["worst"][0]["label"] == "norm"
    base_loss, raw_loss = summary["loss"]
    assert isinstance(base_loss, float) and isinstance(raw_loss, float) and base_loss != raw_loss
    assert [p["phase"] for p in summary["phases"]] == ["forward", "backward"]
    json.dumps(summary)


def test_a_view_that_agrees_opens_on_the_row_closest_to_its_tolerance():
    """It opened on `<inputs>`, which agree bit for bit: an empty histogram and a blank map."""
    from nbdiff.view.model import start_row

    result = nbdiff.auto_diff(BUILDERS["mlp"]("torch"), BUILDERS["mlp"]("paddle"), inputs("mlp"))
    assert result
    tree = build_tree(result)
    start = start_row(tree)
    rows = [n for n in tree.nodes if n["event"] >= 0 and n["ratio"] is not None]
    assert tree.nodes[start]["label"] != "<inputs>" and tree.nodes[start]["ratio"] == max(n["ratio"] for n in rows)
    assert node_detail(tree, start)["picture"]["zeros"] < node_detail(tree, start)["picture"]["total"]
