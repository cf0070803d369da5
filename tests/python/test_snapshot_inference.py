"""Specification of the inference rules for snapshots PyTorch wrote (csrc/core/
snapshot_inference.cpp; docs/snapshot.md, "Inference rules").

Each rule gets a hand-built snapshot in torch's layout (tests/python/snapshot_builder.py) where
it must fire, with the exact bytes it decides, and one where it must not. Phases come from
record_function annotations (exact), so each spec controls them. Every report also satisfies the
invariants of the reasons table: at the peak and at the end, the bytes of all reasons sum to the
report's live bytes, category by category."""
from __future__ import annotations

import json

import pytest

import ridgescope as rs
from snapshot_builder import BACKWARD, FORWARD, USER, SnapshotBuilder, chain, decided

ADAMW_INIT = (("torch/optim/adamw.py", "_init_group"), ("torch/optim/adamw.py", "step"),
              ("torch/optim/optimizer.py", "wrapper"))
ADAMW_TMP = (("torch/optim/adamw.py", "_single_tensor_adamw"), ("torch/optim/adamw.py", "step"))
OPT_STEP = "Optimizer.step#AdamW.step"


def report_of(b: SnapshotBuilder, tmp_path, **options) -> dict:
    r = rs.load(b.write(tmp_path / "snapshot.pickle"), **options).to_dict()
    check_reasons_cover_every_byte(r)
    return r


def check_reasons_cover_every_byte(r: dict) -> None:
    peak = {c: 0 for c in rs.CATEGORIES}
    end = {c: 0 for c in rs.CATEGORIES}
    for x in r["snapshot"]["reasons"]:
        peak[x["category"]] += x["peak_bytes"]
        end[x["category"]] += x["end_bytes"]
    assert peak == r["peak"]["by_category"]
    assert end == r["totals"]["final_by_category"]


def forward_backward(b: SnapshotBuilder, grad_bytes: int | None = 4096, act_bytes: int = 40960) -> dict:
    """One forward (an activation, a temporary) and one backward (a kept gradient, the
    activation freed)."""
    b.begin("forward")
    act = b.alloc(act_bytes, FORWARD)
    tmp = b.alloc(1024, FORWARD)
    b.free(tmp, FORWARD)
    b.end("forward")
    b.begin("backward")
    grad = b.alloc(grad_bytes, BACKWARD) if grad_bytes else None
    b.free(act, BACKWARD)
    b.end("backward")
    return {"act": act, "grad": grad}


# --------------------------------------------------------------------------- sizes
def test_parameter_matched_gradient_names_the_weight_a_gradient_of_its_size_matches(tmp_path):
    """Scenario: a training step recorded after the model was loaded (its weights have no
    stack). Given two weights older than the trace (4096 and 8192 bytes) and a backward that
    makes one 4096-byte gradient, when the snapshot is read, then the 4096-byte weight is a
    parameter because the gradient matches it, and the 8192-byte one is a parameter by its
    lifetime only."""
    b = SnapshotBuilder()
    b.pre(4096)
    b.pre(8192)
    forward_backward(b, grad_bytes=4096)
    r = report_of(b, tmp_path)
    d = decided(r)
    assert d["parameter_matched_gradient"] == {
        "category": "parameter", "allocations": 1, "peak_bytes": 4096, "end_bytes": 4096,
        "reasons": ["live before the first forward, matched by a gradient of the same size allocated in backward"]}
    assert d["weights_by_lifetime"]["end_bytes"] == 8192
    assert d["gradient_kept"]["end_bytes"] == 4096
    assert d["activation"]["peak_bytes"] == 40960 and d["temporary"]["allocations"] == 1
    # the peak: both weights, the activation and the gradient
    assert r["peak"]["bytes"] == 4096 + 8192 + 40960 + 4096
    assert r["peak"]["by_category"]["parameter"] == 12288 and r["peak"]["inferred_by_category"]["parameter"] == 12288
    assert r["totals"]["final_by_category"]["unknown"] == 0


@pytest.mark.parametrize("case", ["no backward", "freed before backward", "another size"])
def test_parameter_matched_gradient_does_not_fire_without_a_matching_gradient(tmp_path, case):
    """Given a 4096-byte block older than the trace, when there is no backward, or the block is
    freed before the backward, or the gradient has another size, then no gradient matches it."""
    b = SnapshotBuilder()
    w = b.pre(4096)
    if case == "no backward":
        b.begin("forward")
        b.free(b.alloc(1024, FORWARD), FORWARD)
        b.end("forward")
    else:
        b.begin("forward")
        if case == "freed before backward":
            b.free(w, (("cleanup.py", "drop"),))
        b.end("forward")
        b.begin("backward")
        b.alloc(4096 if case == "freed before backward" else 6144, BACKWARD)
        b.end("backward")
    d = decided(report_of(b, tmp_path))
    assert "parameter_matched_gradient" not in d
    if case == "freed before backward":
        assert d["unknown"]["allocations"] == 1 and d["unknown"]["peak_bytes"] == 4096
    else:
        assert d["weights_by_lifetime"]["end_bytes"] == 4096


def test_optimizer_state_replaced_names_old_state_freed_where_its_successor_is_made(tmp_path):
    """Scenario: a hand-written Adam that computes new moments each step (m = b1 * m + ...).
    Given a weight and its moment, both older than the trace, when the optimizer step (torch's
    Optimizer.step# annotation) makes a new 4096-byte moment and frees the old one, then the old
    one is optimizer state (replaced), the new one optimizer state (kept), and the weight, live
    to the end, is the parameter the gradient matches."""
    b = SnapshotBuilder()
    b.pre(4096)                      # the weight
    m_old = b.pre(4096)              # last step's moment
    forward_backward(b, grad_bytes=4096)
    step = (("optim.py", "step"),) + USER
    b.begin(OPT_STEP)
    b.alloc(4096, step)
    b.free(m_old, step)
    b.end(OPT_STEP)
    d = decided(report_of(b, tmp_path))
    assert d["parameter_matched_gradient"]["end_bytes"] == 4096
    assert d["optimizer_state_replaced"]["allocations"] == 1
    assert d["optimizer_state_replaced"]["category"] == "optimizer_state"
    assert d["optimizer_state_replaced"]["end_bytes"] == 0 and d["optimizer_state_replaced"]["peak_bytes"] == 4096
    assert d["optimizer_state_kept"]["end_bytes"] == 4096


def test_optimizer_state_replaced_does_not_fire_without_a_successor_of_its_size(tmp_path):
    """Given an old block freed in the optimizer step, when the step keeps no block of its size,
    then it is not taken for replaced state."""
    b = SnapshotBuilder()
    old = b.pre(2048)
    forward_backward(b, grad_bytes=None)
    b.begin(OPT_STEP)
    b.alloc(4096, (("optim.py", "step"),) + USER)
    b.free(old, (("cleanup.py", "drop"),))
    b.end(OPT_STEP)
    d = decided(report_of(b, tmp_path))
    assert "optimizer_state_replaced" not in d
    assert d["unknown"]["allocations"] == 1 and d["unknown"]["peak_bytes"] == 2048


def test_gradient_zero_grad_names_old_gradients_zero_grad_frees(tmp_path):
    """Given a gradient older than the trace, when zero_grad (torch's Optimizer.zero_grad#
    annotation) frees it, then it is a gradient; a block freed elsewhere is not."""
    b = SnapshotBuilder()
    g_old = b.pre(4096)
    other = b.pre(2048)
    b.begin("Optimizer.zero_grad#AdamW.zero_grad")
    b.free(g_old, (("torch/optim/optimizer.py", "zero_grad"),) + USER)
    b.end("Optimizer.zero_grad#AdamW.zero_grad")
    b.begin("forward")
    b.free(other, (("cleanup.py", "drop"),))
    b.end("forward")
    d = decided(report_of(b, tmp_path))
    assert d["gradient_zero_grad"] == {
        "category": "gradient", "allocations": 1, "peak_bytes": 4096, "end_bytes": 0,
        "reasons": ["live before the first forward and freed by zero_grad (a .grad set to None)"]}
    assert d["unknown"]["allocations"] == 1 and d["unknown"]["peak_bytes"] == 2048


def test_parameter_shaped_state_names_per_parameter_state_made_before_the_loop(tmp_path):
    """Scenario: a gradient estimator keeps one zeros_like(p) per parameter, made in its
    __init__. Given parameters of 4096 and 8192 bytes (moved by Module.to), when one place of
    the user's code makes a 4096- and an 8192-byte block outside any phase, then they are
    optimizer state; another place making blocks of other sizes is not."""
    b = SnapshotBuilder()
    to = chain((("torch/nn/modules/module.py", "convert"), ("torch/nn/modules/module.py", "_apply"),
                ("torch/nn/modules/module.py", "to")), USER)
    b.alloc(4096, to)
    b.alloc(8192, to)
    state = (("estimator.py", "__init__"),) + USER
    b.alloc(4096, state)
    b.alloc(8192, state)
    mixed = (("other.py", "setup"),) + USER
    b.alloc(4096, mixed)
    b.alloc(1536, mixed)
    b.begin("forward")
    b.free(b.alloc(1024, FORWARD), FORWARD)
    b.end("forward")
    d = decided(report_of(b, tmp_path))
    assert d["parameter_frames"]["end_bytes"] == 12288
    assert d["parameter_shaped_state"]["category"] == "optimizer_state"
    assert d["parameter_shaped_state"]["end_bytes"] == 12288 and d["parameter_shaped_state"]["allocations"] == 2
    assert d["parameter_shaped_state"]["reasons"] == [
        "made outside any phase at estimator.py:10 in __init__, one block the size of each of a set of parameters "
        "(per-parameter state, as an optimizer keeps)"]
    assert d["input_before_forward"]["end_bytes"] == 4096 + 1536  # the other place: inputs by lifetime


# --------------------------------------------------------------------------- frames
def test_optimizer_init_group_names_the_state_torch_optim_creates_lazily(tmp_path):
    """Given AdamW's first step, when _init_group (torch/optim/adamw.py) makes a block, then it
    is optimizer state with that frame as its reason; the step's temporaries are not, nor is a
    user's own _init_group outside torch/optim."""
    b = SnapshotBuilder()
    b.begin(OPT_STEP)
    b.alloc(4096, chain(ADAMW_INIT, USER))
    b.free(b.alloc(1024, chain(ADAMW_TMP, USER)), chain(ADAMW_TMP, USER))
    b.alloc(2048, (("myoptim.py", "_init_group"),) + USER)
    b.end(OPT_STEP)
    d = decided(report_of(b, tmp_path))
    assert d["optimizer_init_group"] == {
        "category": "optimizer_state", "allocations": 1, "peak_bytes": 4096, "end_bytes": 4096,
        "reasons": ["allocated under torch/optim/adamw.py _init_group"]}
    assert d["temporary"]["allocations"] == 1
    assert d["optimizer_state_kept"]["end_bytes"] == 2048


def test_accumulate_grad_names_the_gradient_autograd_writes(tmp_path):
    """Given a backward with C++ stacks, when AccumulateGrad makes a block, then it is a
    gradient with the C++ function (without arguments) as its frame; a block another backward
    function makes and frees is a temporary."""
    b = SnapshotBuilder()
    b.begin("backward")
    acc = (("??", "void torch::autograd::AccumulateGrad::accumulateGrad<std::function<void (at::Tensor&&)> >"
                  "(at::Tensor const&, at::Tensor&, at::Tensor const&, unsigned long, std::function<void "
                  "(at::Tensor&&)> const&)"),
           ("accumulate_grad.cpp", "torch::autograd::AccumulateGrad::apply(std::vector<at::Tensor>&&)")) + BACKWARD
    b.alloc(4096, acc)
    mm = (("??", "torch::autograd::generated::MmBackward0::apply(std::vector<at::Tensor>&&)"),) + BACKWARD
    b.free(b.alloc(2048, mm), mm)
    b.end("backward")
    d = decided(report_of(b, tmp_path))
    assert d["accumulate_grad"]["category"] == "gradient" and d["accumulate_grad"]["end_bytes"] == 4096
    assert d["accumulate_grad"]["reasons"] == [
        "allocated by torch::autograd::AccumulateGrad::accumulateGrad (autograd accumulating a parameter's .grad)"]
    assert d["temporary"]["allocations"] == 1 and "gradient_kept" not in d


@pytest.mark.parametrize("frame,shown", [
    (("torch/nn/modules/module.py", "_apply"), "torch/nn/modules/module.py _apply"),
    (("torch/nn/modules/module.py", "load_state_dict"), "torch/nn/modules/module.py load_state_dict"),
    (("transformers/modeling_utils.py", "from_pretrained"), "modeling_utils.py from_pretrained"),
    (("torch/nn/modules/linear.py", "reset_parameters"), "torch/nn/modules/linear.py reset_parameters"),
    (("torch/nn/modules/linear.py", "__init__"), "torch/nn/modules/linear.py __init__"),
    (("torch/nn/parameter.py", "__new__"), "torch/nn/parameter.py __new__"),
])
def test_parameter_frames_name_weights_made_loaded_or_moved(tmp_path, frame, shown):
    """Given a block made under Module._apply (.to/.cuda), load_state_dict, from_pretrained,
    reset_parameters, an nn.Module __init__ or torch/nn/parameter.py, then it is a parameter
    with that frame as its reason, even once freed (a layer moved off the device again); a
    block the user's code makes directly is not."""
    b = SnapshotBuilder()
    w = b.alloc(4096, (frame,) + USER)
    b.alloc(2048, USER)
    b.begin("forward")
    b.free(w, FORWARD)
    b.end("forward")
    d = decided(report_of(b, tmp_path))
    assert d["parameter_frames"]["allocations"] == 1 and d["parameter_frames"]["peak_bytes"] == 4096
    assert d["parameter_frames"]["reasons"] == [
        f"allocated under {shown} (weights made, loaded or moved to the device)"]
    assert d["input_before_forward"]["end_bytes"] == 2048


def test_workspace_frames_name_a_cublas_handles_workspace(tmp_path):
    """Given the workspace cuBLAS makes for the backward thread's handle (getNewWorkspace),
    kept like a gradient, then it is a workspace, not a gradient."""
    b = SnapshotBuilder()
    b.begin("backward")
    b.alloc(8192, (("??", "at::cuda::getNewWorkspace()"), ("??", "at::cuda::getCurrentCUDABlasHandle()")) + BACKWARD)
    b.alloc(4096, BACKWARD)
    b.end("backward")
    d = decided(report_of(b, tmp_path))
    assert d["workspace_frames"] == {"category": "workspace", "allocations": 1, "peak_bytes": 8192, "end_bytes": 8192,
                                     "reasons": ["allocated by at::cuda::getNewWorkspace (a library's workspace)"]}
    assert d["gradient_kept"]["end_bytes"] == 4096


def test_data_loader_frames_name_the_batch(tmp_path):
    """Given a block the data loader's collate makes on the device, then it is an input."""
    b = SnapshotBuilder()
    b.alloc(4096, (("torch/utils/data/_utils/collate.py", "default_collate"),) + USER)
    d = decided(report_of(b, tmp_path))
    assert d["data_loader"]["category"] == "input" and d["data_loader"]["end_bytes"] == 4096


def test_workspace_size_names_a_stackless_block_of_cublas_default_workspace_size(tmp_path):
    """Given blocks older than the trace without a stack, when one has exactly cuBLAS's default
    workspace size (2 x 4 MiB + 8 x 16 KiB), then it is a workspace; one 512 bytes larger is a
    weight, and one of that size made under a C++ frame is not decided by its size."""
    b = SnapshotBuilder()
    b.pre(8_519_680)
    b.pre(8_519_680 + 512)
    b.alloc(8_519_680, (("??", "at::native::addmm_out_cuda_impl(at::Tensor&)"),) + USER)
    b.begin("forward")
    b.free(b.alloc(1024, FORWARD), FORWARD)
    b.end("forward")
    d = decided(report_of(b, tmp_path))
    assert d["workspace_size"]["allocations"] == 1 and d["workspace_size"]["end_bytes"] == 8_519_680
    assert d["weights_by_lifetime"]["end_bytes"] == 8_519_680 + 512
    assert d["input_before_forward"]["end_bytes"] == 8_519_680


# --------------------------------------------------------------------------- lifetimes
def test_gradient_kept_and_optimizer_state_kept_name_what_outlives_its_phase(tmp_path):
    """Given blocks without stacks, when one made in backward outlives it, and one made in the
    optimizer step outlives the step, then they are a gradient and optimizer state; blocks
    freed inside their phase are temporaries."""
    b = SnapshotBuilder()
    b.begin("backward")
    b.alloc(4096, ())
    b.free(b.alloc(2048, ()), ())
    b.end("backward")
    b.begin("Optimizer.step#SGD.step")
    b.alloc(8192, ())
    b.free(b.alloc(1024, ()), ())
    b.end("Optimizer.step#SGD.step")
    d = decided(report_of(b, tmp_path))
    assert d["gradient_kept"]["end_bytes"] == 4096 and d["gradient_kept"]["allocations"] == 1
    assert d["optimizer_state_kept"]["end_bytes"] == 8192 and d["optimizer_state_kept"]["allocations"] == 1
    assert d["temporary"]["allocations"] == 2 and d["temporary"]["end_bytes"] == 0


def test_temporary_activation_and_forward_output_follow_the_phases(tmp_path):
    """Given a forward and a backward, then: a block made and freed in forward is a temporary;
    one made in forward and freed in backward an activation, and so is the loss, made between
    the forward and the backward; one made in forward and kept past the backward is a forward
    output; a block made before the forward and freed in backward is not an activation."""
    b = SnapshotBuilder()
    batch = b.alloc(2048, USER)
    b.begin("forward")
    act = b.alloc(40960, FORWARD)
    out = b.alloc(8192, FORWARD)
    b.free(b.alloc(512, FORWARD), FORWARD)
    b.end("forward")
    loss = b.alloc(1024, (("loss.py", "cross_entropy"),) + USER)  # the peak
    b.begin("backward")
    b.free(act, BACKWARD)
    b.free(loss, BACKWARD)
    b.free(batch, BACKWARD)
    b.end("backward")
    d = decided(report_of(b, tmp_path))
    assert d["activation"]["allocations"] == 2 and d["activation"]["peak_bytes"] == 40960 + 1024
    assert d["temporary"]["allocations"] == 1 and d["temporary"]["peak_bytes"] == 0
    assert d["forward_output"] == {"category": "activation", "allocations": 1, "peak_bytes": 8192, "end_bytes": 8192,
                                   "reasons": ["made in forward and still live after it, not freed by a backward "
                                               "(an output the caller kept)"]}
    assert d["input_before_forward"]["peak_bytes"] == 2048  # the batch


def test_temporary_in_one_idle_stretch_and_input_live_into_the_forward(tmp_path):
    """Given blocks the user's code makes outside any phase, when one is freed before the
    forward begins it is a temporary, and one still live when it begins is an input named by
    where it was made."""
    b = SnapshotBuilder()
    b.free(b.alloc(1024, USER), USER)
    b.alloc(2048, USER)
    b.begin("forward")
    b.free(b.alloc(512, FORWARD), FORWARD)
    b.end("forward")
    d = decided(report_of(b, tmp_path))
    assert d["temporary"]["allocations"] == 2
    assert d["input_before_forward"]["end_bytes"] == 2048
    assert d["input_before_forward"]["reasons"] == [
        "made by the user's code outside any phase before a forward, and still live when it began: train.py:10 in main"]


@pytest.mark.parametrize("case", ["forward", "no forward", "freed"])
def test_weights_by_lifetime_needs_a_forward_and_a_block_live_to_the_end(tmp_path, case):
    """Given a block without a stack older than the trace, when the trace has a forward and the
    block lives to the end, then it is a parameter by its lifetime; without a forward, or freed
    during the trace, it is not."""
    b = SnapshotBuilder()
    w = b.pre(4096)
    if case != "no forward":
        b.begin("forward")
        b.free(b.alloc(1024, FORWARD), FORWARD)
        b.end("forward")
    else:
        b.free(b.alloc(1024, USER), USER)
    if case == "freed":
        b.free(w, (("cleanup.py", "drop"),))
    d = decided(report_of(b, tmp_path))
    if case == "forward":
        assert d["weights_by_lifetime"] == {
            "category": "parameter", "allocations": 1, "peak_bytes": 4096, "end_bytes": 4096,
            "reasons": ["live before the first forward and to the end, no stack (weights loaded before recording began)"]}
    else:
        assert "weights_by_lifetime" not in d and d["unknown"]["allocations"] == 1


def test_forward_frames_name_what_a_segments_only_snapshot_holds_inside_a_module_call(tmp_path):
    """Scenario: _dump_snapshot() with history on but a trace ring that kept nothing. Given
    blocks the segments hold, when one was made inside an nn.Module call, then it is an
    activation named by its module path; the recording saw a forward, so a block without a stack
    is a weight; a block the user's code made outside any module stays unknown."""
    b = SnapshotBuilder()
    b.pre(8192, FORWARD)
    b.pre(4096)
    b.pre(2048, USER)
    d = decided(report_of(b, tmp_path))
    assert d["forward_frames"]["category"] == "activation" and d["forward_frames"]["end_bytes"] == 8192
    assert d["forward_frames"]["reasons"] == [
        "older than the trace, made inside an nn.Module call and live when the snapshot was taken: "
        "train.py:15 in main > model.py:13 in forward > linear.py:11 in forward"]
    assert d["weights_by_lifetime"]["end_bytes"] == 4096
    assert d["unknown"]["end_bytes"] == 2048


def test_repeated_step_gives_a_block_older_than_the_trace_the_category_of_its_place(tmp_path):
    """Scenario: recording began in the middle of a forward. Given an activation of that step,
    made before the trace (no stack) and freed by the first backward, when the next, complete
    step frees its activation at the same place, then the old block is an activation too (the
    step repeats); one freed at another place is not."""
    b = SnapshotBuilder()
    old = b.pre(8192)
    other = b.pre(2048)
    free_site = (("torch/autograd/graph.py", "_engine_run_backward"), ("torch/_tensor.py", "backward"),
                 ("train.py", "main"))
    b.begin("backward")
    b.free(old, free_site)
    b.free(other, (("torch/autograd/graph.py", "_engine_run_backward"), ("hooks.py", "cleanup")))
    b.end("backward")
    b.begin("forward")
    act = b.alloc(8192, FORWARD)
    b.end("forward")
    b.begin("backward")
    b.free(act, free_site)
    b.end("backward")
    d = decided(report_of(b, tmp_path))
    assert d["activation"]["allocations"] == 1
    assert d["repeated_step"]["category"] == "activation" and d["repeated_step"]["allocations"] == 1
    assert d["repeated_step"]["peak_bytes"] == 8192
    assert d["unknown"]["allocations"] == 1 and d["unknown"]["peak_bytes"] == 2048


# --------------------------------------------------------------------------- what the snapshot says
def test_a_category_the_snapshot_records_wins_and_an_unknown_name_is_ignored(tmp_path):
    """Given entries that carry a 'category' (memory_viz's profile_plot writes them), then a
    ridgescope category is taken as recorded, not inferred; an unknown name is noted and the
    block is inferred like any other."""
    b = SnapshotBuilder()
    b.begin("forward")
    b.alloc(4096, FORWARD, category="parameter")
    b.free(b.alloc(2048, FORWARD, category="not_a_category"), FORWARD)
    b.end("forward")
    r = report_of(b, tmp_path)
    d = decided(r)
    assert d["recorded"] == {"category": "parameter", "allocations": 1, "peak_bytes": 4096, "end_bytes": 4096,
                             "reasons": ["recorded in the snapshot (its 'category' key)"]}
    assert d["temporary"]["allocations"] == 1
    assert r["peak"]["inferred_by_category"]["parameter"] == 0  # recorded, not inferred
    assert r["snapshot"]["categorised_from_snapshot"] == 1
    assert any("'not_a_category' is not a ridgescope category" in n for n in r["snapshot"]["notes"])


def test_labels_name_where_a_block_was_made_and_the_rule(tmp_path):
    """Given a block made inside two nested module calls, then its label and module name the
    user frame that called the outer module, each module's forward frame, and the rule."""
    b = SnapshotBuilder()
    b.begin("forward")
    b.alloc(4096, FORWARD)
    b.end("forward")
    top = report_of(b, tmp_path)["peak"]["top_blocks"][0]
    assert top["module"] == "train.py:15 in main > model.py:13 in forward > linear.py:11 in forward"
    assert top["label"] == "activation in train.py:15 in main > model.py:13 in forward > linear.py:11 in forward [forward_output]"
    assert top["inferred"] is True


# --------------------------------------------------------------------------- the user's rules
def kv_snapshot() -> SnapshotBuilder:
    b = SnapshotBuilder()
    b.begin("forward")
    b.alloc(4096, (("cache.py", "_update_cache"),) + FORWARD)
    b.alloc(2048, FORWARD)
    b.end("forward")
    b.begin(OPT_STEP)
    b.alloc(8192, chain(ADAMW_INIT, USER))
    b.end(OPT_STEP)
    return b


def test_user_rules_come_before_the_built_in_ones_and_the_first_match_wins(tmp_path):
    """Given rules (tried in order) matching a frame name and a file, when the snapshot is
    read with them, then the blocks they match get their category with the rule's name and
    frame as the reason, even over a built-in frame rule; other blocks are inferred as usual."""
    rules = [{"name": "kv cache", "category": "activation", "frame": "^_update_cache$"},
             {"name": "never", "category": "temporary", "frame": "^_update_cache$"},
             {"name": "optimizer file", "category": "workspace", "file": r"optim/adamw\.py$"}]
    r = report_of(kv_snapshot(), tmp_path, rules=rules)
    d = decided(r)
    assert d["user_rule"]["allocations"] == 2
    assert sorted(d["user_rule"]["reasons"]) == [
        "user rule 'kv cache' matched cache.py _update_cache",
        "user rule 'optimizer file' matched torch/optim/adamw.py _init_group"]
    assert r["totals"]["final_by_category"]["workspace"] == 8192
    assert r["totals"]["final_by_category"]["activation"] == 4096 + 2048  # the rule, and forward_output
    assert "optimizer_init_group" not in d and d["forward_output"]["end_bytes"] == 2048
    assert r["snapshot"]["categorised_from_frames"] == 2


def test_rules_files_in_toml_and_json_and_the_short_form(tmp_path):
    """Given the same rules as a TOML file, a JSON file and the short form (category = regex,
    tried on names and files), then each gives the same categories from the command line."""
    path = kv_snapshot().write(tmp_path / "kv.pickle")
    (tmp_path / "rules.toml").write_text('[[rule]]\nname = "kv cache"\ncategory = "activation"\n'
                                         'frame = "^_update_cache$"\n')
    (tmp_path / "rules.json").write_text(json.dumps({"rule": [{"name": "kv cache", "category": "activation",
                                                               "frame": "^_update_cache$"}]}))
    (tmp_path / "short.toml").write_text('activation = "cache\\\\.py$"\n')
    from ridgescope.cli import main
    for rules in ("rules.toml", "rules.json", "short.toml"):
        out = tmp_path / f"{rules}.report.json"
        assert main(["report", str(path), "--format", "json", "-o", str(out), "--rules", str(tmp_path / rules)]) == 0
        r = json.loads(out.read_text())
        assert decided(r)["user_rule"]["end_bytes"] == 4096, rules


@pytest.mark.parametrize("rules,message", [
    ([{"name": "bad", "category": "activation", "frame": "("}], "rule 'bad': invalid regular expression"),
    ([{"name": "cat", "category": "weights", "frame": "x"}], "unknown category 'weights'"),
    ([{"name": "empty", "category": "activation"}], "needs a 'frame' or a 'file'"),
    ([{"name": "typo", "category": "activation", "frames": "x"}], "unknown key(s) frames"),
])
def test_a_bad_rule_is_a_clear_error_naming_it(tmp_path, rules, message):
    path = kv_snapshot().write(tmp_path / "kv.pickle")
    with pytest.raises(rs.RidgescopeError, match=message.replace("(", r"\(").replace(")", r"\)")):
        rs.load(path, rules=rules)


def test_rules_are_refused_for_a_ridgescope_trace(tmp_path, trace_path):
    import torch
    with rs.track(out=trace_path):
        torch.ones(100)
    with pytest.raises(rs.RidgescopeError, match="category rules apply to torch memory snapshots"):
        rs.load(trace_path, rules=[{"category": "activation", "frame": "x"}])
