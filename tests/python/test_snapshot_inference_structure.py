"""Specification of the evidence the snapshot inference reads from a step's structure when a
snapshot PyTorch wrote has frames but no phase annotations (csrc/core/snapshot/snapshot_phases.cpp,
snapshot_frames.cpp; docs/snapshot.md, "Phases from frames"): a checkpoint's recomputation
nested in the backward, the user's main-thread code ending a phase, a free's own stack, the batch
of a later step, and DDP's gradient buckets (snapshot_frame_rules.cpp, snapshot_matching_rules.cpp).

Every snapshot is hand-built in torch's layout (tests/python/snapshot_builder.py). Frames look as
torch records them with ``stacks="python"``: the main thread's stacks end in the script's
``<module>``; autograd's device thread has no Python frames at all, except where it runs Python
code (the recomputation). Each report also satisfies the reasons table's invariant."""
from __future__ import annotations

import ridgescope as rs
from snapshot_builder import SnapshotBuilder, chain, decided

MAIN = (("train.py", "<module>"),)
MODEL = (("torch/nn/functional.py", "linear"), ("torch/nn/modules/linear.py", "forward"),
         ("torch/nn/modules/module.py", "_call_impl"), ("model.py", "forward"),
         ("torch/nn/modules/module.py", "_call_impl"))
FORWARD = chain(MODEL, MAIN)
LOSS = chain((("torch/nn/functional.py", "cross_entropy"),), MAIN)
BACKWARD = chain((("torch/autograd/__init__.py", "_make_grads"), ("torch/autograd/__init__.py", "backward"),
                  ("torch/_tensor.py", "backward")), MAIN)
RECOMPUTE = chain(MODEL, (("torch/utils/checkpoint.py", "recompute_fn"), ("torch/utils/checkpoint.py", "unpack_hook")))
ENGINE = ()  # autograd's device thread running C++ nodes: no frames
THREAD = (("worker.py", "run"), ("threading.py", "_bootstrap"))  # another Python thread
OPT_STEP = "Optimizer.step#SGD.step"


def report_of(b: SnapshotBuilder, tmp_path) -> dict:
    r = rs.load(b.write(tmp_path / "snapshot.pickle")).to_dict()
    peak = {c: 0 for c in rs.CATEGORIES}
    end = {c: 0 for c in rs.CATEGORIES}
    for x in r["snapshot"]["reasons"]:
        peak[x["category"]] += x["peak_bytes"]
        end[x["category"]] += x["end_bytes"]
    assert peak == r["peak"]["by_category"] and end == r["totals"]["final_by_category"]
    return r


def optimizer_step(b: SnapshotBuilder) -> None:
    b.begin(OPT_STEP)
    b.end(OPT_STEP)


def phases(r: dict) -> list[tuple[int, str, str]]:
    return [(s["step"], p["phase"], p["parent"]) for s in r["steps"] for p in s["phases"]]


# --------------------------------------------------------------------------- recomputation
def checkpointed_step(b: SnapshotBuilder) -> dict[str, int]:
    """A step of a checkpointed model: the forward saves one block, the backward makes a
    temporary, recomputes a block (Python frames on autograd's thread), makes the weight's
    gradient and frees the rest."""
    saved = b.alloc(8192, FORWARD)
    loss = b.alloc(512, LOSS)
    seed = b.alloc(512, BACKWARD)
    tmp = b.alloc(1024, ENGINE)
    recomputed = b.alloc(2048, RECOMPUTE)
    grad = b.alloc(4096, ENGINE)
    for x in (recomputed, tmp, saved, seed):
        b.free(x, None)
    b.free(loss, None)
    return {"saved": saved, "tmp": tmp, "recomputed": recomputed, "grad": grad}


def test_a_recomputation_runs_inside_the_backward_and_its_blocks_are_activations(tmp_path):
    """Scenario: activation checkpointing recorded with Python stacks. Given a backward whose
    allocations have no frames except the recomputation's (a module's forward under
    torch/utils/checkpoint.py's unpack hook), when the snapshot is read, then the recomputation is a
    phase inside the backward (no new step), the recomputed block freed in backward is an
    activation (as are the saved block and the loss), the backward's temporary made before the
    recomputation and freed after it stays a temporary, and the block still live at the
    optimizer step is the gradient."""
    b = SnapshotBuilder()
    weight = b.pre(4096)
    checkpointed_step(b)
    optimizer_step(b)
    r = report_of(b, tmp_path)
    assert (0, "recompute", "backward") in phases(r)
    assert [s["step"] for s in r["steps"]] == [0]
    d = decided(r)
    assert d["activation"]["allocations"] == 3 and d["activation"]["peak_bytes"] == 8192 + 2048 + 512
    assert d["temporary"]["allocations"] == 2 and d["temporary"]["peak_bytes"] == 1024 + 512  # and the seed
    assert d["gradient_kept"]["end_bytes"] == 4096
    assert d["parameter_matched_gradient"]["end_bytes"] == 4096 and weight


def test_a_module_call_on_the_main_thread_after_the_backward_is_a_new_forward(tmp_path):
    """Scenario: the contrast. Given the same module frames called from the script itself (no
    checkpoint frame, no backward under them) after a backward, when the snapshot is read, then
    that is the forward of the next step, not a recomputation."""
    b = SnapshotBuilder()
    b.pre(4096)
    checkpointed_step(b)
    b.alloc(1024, FORWARD)
    r = report_of(b, tmp_path)
    assert [s["step"] for s in r["steps"]] == [0, 1]
    assert (1, "forward", "") in phases(r)


# --------------------------------------------------------------------------- the user's code
def forward_and_loss(b: SnapshotBuilder, loss_frames) -> dict[str, int]:
    saved = b.alloc(8192, FORWARD)
    logits = b.alloc(1024, FORWARD)
    loss = b.alloc(512, loss_frames)
    b.free(logits, None)  # the loss consumed the logits
    b.alloc(512, BACKWARD)
    b.free(saved, None)
    return {"logits": logits, "loss": loss}


def test_the_users_main_thread_code_ends_the_forward(tmp_path):
    """Scenario: the loss computed in the training script. Given logits made in the model's
    forward and freed after the loss, made by the script's own line, when the snapshot is read,
    then the forward ended at the loss: the logits outlived it (an output the caller used:
    activation, not a temporary of the forward), and the loss, made between the forward and
    the backward and live when the backward began, is an activation."""
    b = SnapshotBuilder()
    forward_and_loss(b, LOSS)
    r = report_of(b, tmp_path)
    d = decided(r)
    assert d["forward_output"]["allocations"] == 1 and d["forward_output"]["peak_bytes"] in (0, 1024)
    assert d["activation"]["allocations"] == 2  # the saved block and the loss
    assert "temporary" not in d


def test_code_on_another_thread_does_not_end_the_forward(tmp_path):
    """Scenario: the contrast. Given the same allocation made by a Python thread of its own
    (its stack starts in threading.py, not in the script), when the snapshot is read, then the
    forward goes on: the logits, freed inside it, are a temporary, and the thread's block, made
    inside the forward and kept, is no loss (no activation by the loss rule)."""
    b = SnapshotBuilder()
    forward_and_loss(b, chain((("torch/nn/functional.py", "cross_entropy"),), THREAD))
    d = decided(report_of(b, tmp_path))
    assert d["temporary"]["allocations"] == 1 and d["temporary"]["peak_bytes"] == 1024
    assert d["forward_output"]["allocations"] == 1 and d["forward_output"]["end_bytes"] == 512
    assert d["activation"]["allocations"] == 1  # only the saved block


def test_the_batch_of_a_later_step_is_an_input_not_the_loss(tmp_path):
    """Scenario: two steps. Given each step's batch made by the script after the optimizer step
    (outside any phase, after an earlier forward) and saved by the forward, when the snapshot is
    read, then both batches are inputs: the loss rule takes only blocks made after a forward and
    before its backward."""
    b = SnapshotBuilder()
    b.pre(4096)
    for _ in range(2):
        batch = b.alloc(2048, MAIN)
        saved = b.alloc(8192, FORWARD)
        b.alloc(512, BACKWARD)
        b.free(saved, None)
        b.free(batch, None)
        b.alloc(4096, ENGINE)
        optimizer_step(b)
    d = decided(report_of(b, tmp_path))
    assert d["input_before_forward"]["allocations"] == 2


# --------------------------------------------------------------------------- a free's own stack
def generation(b: SnapshotBuilder, free_frames) -> None:
    """Two forwards of a decoder: the first one's cache is freed by the second; the second's
    cache is freed after it returned, before anything else is allocated."""
    first = b.alloc(4096, FORWARD)
    b.alloc(512, MAIN)  # the next token, picked by the script
    second = b.alloc(8192, FORWARD)
    b.free(first, None)
    b.free(second, free_frames)
    b.alloc(512, MAIN)


def test_a_free_with_its_own_stack_in_the_script_ends_the_forward(tmp_path):
    """Scenario: generation recorded with torch's default context="all" (a free carries its own
    stack). Given the last forward's cache freed by the script's `del` (a stack of the script,
    not the allocation's), when the snapshot is read, then that forward had ended: both caches
    outlived their forward (activation)."""
    b = SnapshotBuilder()
    generation(b, MAIN)
    d = decided(report_of(b, tmp_path))
    assert d["forward_output"]["allocations"] == 2
    assert "temporary" not in d


def test_a_free_carrying_the_allocations_stack_says_nothing_about_the_phase(tmp_path):
    """Scenario: the contrast, context="alloc": the free carries the allocation's own frames
    list. Then nothing shows the forward ended before the free: the last cache is a temporary."""
    b = SnapshotBuilder()
    generation(b, None)
    d = decided(report_of(b, tmp_path))
    assert d["forward_output"]["allocations"] == 1
    assert d["temporary"]["allocations"] == 1


# --------------------------------------------------------------------------- DDP's buckets
DDP = chain((("torch/nn/parallel/distributed.py", "_pre_forward"), ("torch/nn/parallel/distributed.py", "forward"),
             ("torch/nn/modules/module.py", "_call_impl")), MAIN)


def ddp_rebuild(b: SnapshotBuilder, old_bytes: int, old_first: bool = False, between: bool = False) -> None:
    """DDP built before recording (one bucket of `old_bytes`), then its second forward rebuilds
    two buckets of 4096 B each and frees the old one (after them, or `old_first`: just before
    them, `between`: with the batch made in between); a broadcast temporary among them."""
    old = b.pre(old_bytes)
    b.alloc(2048, MAIN)  # the batch
    if old_first:
        b.free(old, ENGINE)
        if between:
            b.alloc(512, MAIN)
    b.alloc(4096, DDP)
    tmp = b.alloc(1024, DDP)
    b.free(tmp, None)
    b.alloc(4096, DDP)
    if not old_first:
        b.free(old, ENGINE)
    b.alloc(2048, FORWARD)


def test_ddp_buckets_are_comm_buffers_and_replace_the_old_ones(tmp_path):
    """Scenario: DistributedDataParallel rebuilding its buckets. Given two blocks made under
    DDP's _pre_forward and kept, a temporary made there and freed at once, and a block older than
    the trace of exactly their total size freed in the same forward, when the snapshot is read,
    then the two buckets are comm_frames, the old bucket comm_buffer_replaced, the temporary a
    temporary."""
    b = SnapshotBuilder()
    ddp_rebuild(b, 8192)
    r = report_of(b, tmp_path)
    d = decided(r)
    assert d["comm_frames"]["category"] == "comm_buffer" and d["comm_frames"]["end_bytes"] == 8192
    assert d["comm_buffer_replaced"]["allocations"] == 1
    assert r["peak"]["by_category"]["comm_buffer"] == 8192 + 8192
    assert d["temporary"]["allocations"] == 1 and d["temporary"]["end_bytes"] == 0


def test_old_buckets_freed_just_before_the_new_ones_are_replaced_too(tmp_path):
    """Scenario: the reducer frees the old bucket first (the order varies from run to run).
    Given its free right before the new buckets, with no allocation in between, then it is
    comm_buffer_replaced; given another allocation in between, it is not."""
    b = SnapshotBuilder()
    ddp_rebuild(b, 8192, old_first=True)
    assert decided(report_of(b, tmp_path))["comm_buffer_replaced"]["allocations"] == 1
    b = SnapshotBuilder()
    ddp_rebuild(b, 8192, old_first=True, between=True)
    assert "comm_buffer_replaced" not in decided(report_of(b, tmp_path))


def test_an_old_block_of_another_size_is_not_taken_for_a_bucket(tmp_path):
    """Scenario: the contrast. Given the old block's size matching neither a bucket nor their
    total, then it is not a comm buffer."""
    b = SnapshotBuilder()
    ddp_rebuild(b, 12288)
    d = decided(report_of(b, tmp_path))
    assert "comm_buffer_replaced" not in d
    assert d["comm_frames"]["allocations"] == 2


# --------------------------------------------------------------------------- how sure
def test_the_report_says_how_strong_the_evidence_behind_each_byte_is(tmp_path):
    """Scenario: a checkpointed step with a frozen weight. Given a weight a gradient matches
    (the step's structure), a frozen weight no gradient matches (live from before the trace to
    the end: lifetime alone), and the step's blocks, when the snapshot is read, then every reason
    carries its evidence, snapshot.confidence sums the peak by evidence to the byte, and the text
    report names the weaker rules' bytes next to the composition."""
    b = SnapshotBuilder()
    b.pre(4096)
    frozen = b.pre(3072)
    checkpointed_step(b)
    optimizer_step(b)
    path = b.write(tmp_path / "snapshot.pickle")
    report = rs.load(path)
    r = report.to_dict()
    evidence = {x["rule"]: x["evidence"] for x in r["snapshot"]["reasons"]}
    assert evidence["weights_by_lifetime"] == "weak" and evidence["parameter_matched_gradient"] == "structure"
    assert evidence["activation"] == "structure"
    conf = r["snapshot"]["confidence"]
    assert sum(conf["peak_bytes_by_evidence"].values()) == r["peak"]["bytes"]
    assert conf["peak_by_evidence"]["weak"]["parameter"] == conf["weak_peak_bytes"] == 3072 and frozen
    assert conf["weak_share_of_peak"] == 3072 / r["peak"]["bytes"]
    assert "3.00 KiB of it by size or lifetime alone" in report.summary()
    assert "by size or lifetime alone" in report.summary().split("how the peak's bytes were decided:")[1]


def test_without_any_phase_the_lifetime_rules_are_weak(tmp_path):
    """Scenario: a snapshot recorded without stacks or annotations. Given blocks made and freed
    with no phase anywhere, when the snapshot is read, then their `temporary` is lifetime alone."""
    b = SnapshotBuilder()
    x = b.alloc(1024, ())
    b.free(x, ())
    b.alloc(2048, ())
    r = rs.load(b.write(tmp_path / "snapshot.pickle")).to_dict()
    assert {x["rule"]: x["evidence"] for x in r["snapshot"]["reasons"]}["temporary"] == "weak"


def test_the_first_steps_batch_that_gets_a_gradient_is_no_parameter(tmp_path):
    """Scenario: a reentrant checkpoint needs its input to require grad, so the batch gets a
    gradient of its own size, like a weight. Given a weight older than the trace and the first
    step's batch of the same size, both given a gradient by the backward, and the batch freed
    after the backward, before the optimizer step, when the snapshot is read, then only the weight
    is a parameter (a parameter lives through the first step) and the batch is an input."""
    b = SnapshotBuilder()
    b.pre(4096)
    batch = b.alloc(4096, MAIN)
    saved = b.alloc(8192, FORWARD)
    b.alloc(512, BACKWARD)
    b.alloc(4096, ENGINE)  # the weight's gradient
    grad_of_batch = b.alloc(4096, ENGINE)
    b.free(saved, ENGINE)
    b.free(grad_of_batch, MAIN)
    b.free(batch, MAIN)
    optimizer_step(b)
    d = decided(report_of(b, tmp_path))
    assert d["parameter_matched_gradient"]["allocations"] == 1 and d["parameter_matched_gradient"]["end_bytes"] == 4096
    assert d["input_before_forward"]["allocations"] == 1
