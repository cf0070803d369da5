"""Specification of every model's parameters (python/ridgescope/_models.py, _model_frames.py):
the second models a script holds besides the one it trains — made before or during tracking,
however they were made — are found, named, tagged and listed with their exact bytes.

Each scenario trains a small MLP (the tracked or first-trained model) for a few AdamW steps
while a second model exists. The truth comes from the modules themselves: the bytes of their
parameter and buffer storages."""
from __future__ import annotations

import copy
import gc
import sys
import weakref

import pytest
import torch

import ridgescope as rs
from ridgescope._model_frames import FrameScanner

nn = torch.nn


def mlp(width: int = 32, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, width), nn.GELU(), nn.Linear(width, 4))


def storage_bytes(tensors) -> int:
    seen = {}
    for t in tensors:
        seen.setdefault(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
    return sum(seen.values())


def train(model: nn.Module, steps: int = 2, other=None) -> list[float]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for i in range(steps):
        g = torch.Generator().manual_seed(i)
        x, y = torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)
        if other is not None:
            with torch.no_grad():
                target = other(x).softmax(-1)
        out = model(x)
        loss = torch.nn.functional.cross_entropy(out, y if other is None else target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def models_of(report) -> dict[str, dict]:
    return {m["name"]: m for m in report.to_dict()["model"]["models"]}


def blocks(report, trace):
    full = rs.load(trace, top_blocks=100_000).to_dict()
    return [b for b in full["peak"]["top_blocks"] if b["category"] in ("parameter", "buffer")]


def test_a_frozen_deepcopy_made_while_tracking_is_its_own_model(trace_path):
    """Given rs.track(model=policy) and, inside it, ref = copy.deepcopy(policy) frozen (no
    registration hook sees a deepcopy), then at the step's end ref is found under its variable's
    name, its parameters are tagged `ref: <path> (frozen)`, and both models' bytes are exact."""
    policy = mlp()
    opt = torch.optim.AdamW(policy.parameters())
    with rs.track(model=policy, out=trace_path) as s:
        ref = copy.deepcopy(policy).requires_grad_(False)
        for i in range(2):  # the loop where ref is called ref (a helper would call it otherwise)
            x = torch.randn(8, 16, generator=torch.Generator().manual_seed(i))
            with torch.no_grad():
                target = ref(x)
            loss = torch.nn.functional.mse_loss(policy(x), target)
            opt.zero_grad()
            loss.backward()
            opt.step()
    report = s.report()
    models = models_of(report)
    assert list(models) == ["policy", "ref"]  # the tracked model first, each by its variable
    truth = storage_bytes(policy.parameters())
    for m in models.values():
        assert m["at_peak"]["parameter_bytes"] == m["parameter_bytes"] == truth
    assert models["ref"]["trainable"] is False and models["ref"]["found"] == "variable"
    labels = [b["label"] for b in blocks(report, trace_path) if b["label"].startswith("ref: ")]
    assert sorted(labels) == sorted(f"ref: {n} (frozen)" for n, _ in ref.named_parameters())
    assert report.to_dict()["peak"]["by_category"]["parameter"] == 2 * truth
    text = report.summary()  # the text report lists both, with their bytes
    assert "Models: 2, with their parameters (and buffers) live at the peak:" in text
    assert any(line.split()[:1] == ["ref"] and "frozen" in line for line in text.splitlines())


def test_a_teacher_made_before_tracking_is_adopted(trace_path):
    """Given a teacher of another width built before rs.track(model=student), then its storages
    (made before the session) are adopted when tracking starts and counted exactly."""
    teacher = mlp(width=128, seed=1)
    student = mlp()
    with rs.track(model=student, out=trace_path) as s:
        train(student, other=teacher)
    models = models_of(s.report())
    assert models["teacher"]["at_peak"]["parameter_bytes"] == storage_bytes(teacher.parameters())
    assert models["teacher"]["trainable"] is True  # its parameters require gradients
    assert s.report().to_dict()["peak"]["by_category"]["parameter"] == \
        storage_bytes(student.parameters()) + storage_bytes(teacher.parameters())


def test_a_model_loaded_with_assign_and_one_materialised_with_to_empty_are_found(trace_path):
    """Given, while tracking, a module built on the meta device and filled with
    load_state_dict(assign=True) (registration hooks see the assignment), and another built on
    meta, found at a step's end with no storage yet, then materialised with to_empty (which
    replaces its parameters without any hook), then both are listed with exact bytes once they
    hold storage."""
    student = mlp()
    with rs.track(model=student, out=trace_path) as s:
        state = {k: v.clone() for k, v in mlp(width=64, seed=2).state_dict().items()}
        with torch.device("meta"):
            loaded = mlp(width=64)
            empty = mlp(width=48)
        loaded.load_state_dict(state, assign=True)
        train(student, steps=1)
        empty.to_empty(device="cpu")
        train(student, steps=1)
    models = models_of(s.report())
    assert models["loaded"]["at_peak"]["parameter_bytes"] == storage_bytes(loaded.parameters())
    assert models["empty"]["at_peak"]["parameter_bytes"] == storage_bytes(empty.parameters())
    assert models["empty"]["parameter_bytes"] == storage_bytes(empty.parameters())


def test_a_model_no_variable_holds_is_named_by_its_class_and_where_it_was_made(trace_path):
    """Given a module made while tracking and kept where no frame's variables reach (two
    containers deep), then it is listed as '<class> created at <file>:<line>'."""
    student = mlp()
    keep = {"deep": {"er": None}}
    with rs.track(model=student, out=trace_path) as s:
        line = sys._getframe().f_lineno + 1
        keep["deep"]["er"] = nn.Linear(16, 256)
        train(student)
    models = models_of(s.report())
    name = f"Linear created at test_models.py:{line}"
    assert name in models, list(models)
    assert models[name]["at_peak"]["parameter_bytes"] == storage_bytes(keep["deep"]["er"].parameters())
    assert models[name]["found"] == "created" and models[name]["created_at"] == f"test_models.py:{line}"


def test_a_copy_of_the_weights_in_a_list_or_a_dict_is_a_model_but_views_are_not(trace_path):
    """Given an EMA kept as a list of tensor copies (diffusers' EMAModel.shadow_params) and one
    kept as a dict of clones of the state dict, and also the model's own state_dict (views of
    its parameters) held in a variable, then the two copies are listed as copies of the model,
    with exact bytes, and the views are not."""
    student = mlp()
    with rs.track(model=student, out=trace_path) as s:
        shadow = [p.clone().detach() for p in student.parameters()]
        ema_state = {k: v.detach().clone() for k, v in student.state_dict().items()}
        views = student.state_dict()
        train(student)
    models = models_of(s.report())
    assert list(models) == ["student", "shadow", "ema_state"]
    truth = storage_bytes(student.parameters())
    for name in ("shadow", "ema_state"):
        assert models[name]["copy_of"] == "student" and models[name]["found"] == "collection"
        assert models[name]["at_peak"]["parameter_bytes"] == truth and not models[name]["trainable"]
    assert views


def test_kept_gradients_shaped_like_the_parameters_stay_gradients(trace_path):
    """Given a list of the model's gradients kept across a zero_grad(set_to_none=True) (shaped
    exactly like its parameters, as a copy of the weights would be), then their blocks stay
    `gradient`: a copy of the weights is tagged weakly, and a gradient's tag is strong."""
    student = mlp()
    with rs.track(model=student, out=trace_path) as s:
        train(student, steps=1)
        grads = [p.grad for p in student.parameters()]
        train(student, steps=1)
    peak = s.report().to_dict()["peak"]["by_category"]
    assert peak["parameter"] == storage_bytes(student.parameters())
    assert grads


def test_a_second_trainable_model_has_its_gradients_and_optimizer_state_named(trace_path):
    """Given a GAN-like loop (a generator, the root, and a discriminator with its own optimizer,
    both trained every step), then the discriminator's gradients and Adam moments carry its
    name, and its gradient bytes at the end of backward are exact."""
    gen, disc = mlp(), nn.Sequential(nn.Linear(4, 64), nn.ReLU(), nn.Linear(64, 1))
    g_opt = torch.optim.Adam(gen.parameters())
    d_opt = torch.optim.Adam(disc.parameters())
    with rs.track(model=gen, optimizer=g_opt, out=trace_path) as s:
        for i in range(3):
            x = torch.randn(8, 16, generator=torch.Generator().manual_seed(i))
            d_loss = disc(gen(x).detach()).mean()
            d_opt.zero_grad()
            d_loss.backward()
            d_opt.step()
            g_loss = -disc(gen(x)).mean()
            g_opt.zero_grad()
            g_loss.backward()
            g_opt.step()
    full = rs.load(trace_path, top_blocks=100_000).to_dict()
    labels = {b["label"]: b for b in full["peak"]["top_blocks"]}
    for name, p in disc.named_parameters():
        assert f"disc: {name}" in labels
        assert labels[f"grad of disc: {name}"]["bytes"] == p.numel() * 4
        assert f"exp_avg of disc: {name}" in labels
    assert models_of(s.report())["disc"]["trainable"] is True


def test_modules_without_tensors_and_wrappers_of_the_model_are_not_models(trace_path):
    """Given a loss module called from outside any module every step, and a Sequential made
    while tracking around the tracked model (it holds only the model's own parameters), then
    neither is listed."""
    student = mlp()
    with rs.track(model=student, out=trace_path) as s:
        wrapper = nn.Sequential(student)
        loss_fn = nn.CrossEntropyLoss()
        opt = torch.optim.AdamW(student.parameters())
        for i in range(2):
            loss = loss_fn(wrapper(torch.randn(4, 16)), torch.tensor([0, 1, 2, 3]))
            opt.zero_grad()
            loss.backward()
            opt.step()
    assert len(models_of(s.report())) == 1


def test_without_a_model_a_frozen_module_called_first_is_not_the_root(trace_path):
    """Given rs.track() with no model, a frozen teacher called under no_grad before the trained
    student each step (distillation), then the student is the root (its forward is the
    `forward` phase, its parameters carry plain paths) and the teacher a second model."""
    teacher, student = mlp(width=64, seed=1).requires_grad_(False), mlp()
    with rs.track(out=trace_path) as s:
        opt = torch.optim.AdamW(student.parameters())
        for i in range(2):
            x = torch.randn(8, 16, generator=torch.Generator().manual_seed(i))
            with torch.no_grad():
                t = teacher(x)
            loss = torch.nn.functional.mse_loss(student(x), t)
            opt.zero_grad()
            loss.backward()
            opt.step()
    data = s.report().to_dict()
    names = [m["name"] for m in data["model"]["models"]]
    assert names == ["student", "teacher"]
    assert data["model"]["trainable_parameters"] == sum(p.numel() for p in student.parameters())
    assert [p["phase"] for p in data["steps"][0]["phases"]] == [
        "forward", "zero_grad", "backward", "optimizer_step"]
    assert data["peak"]["by_category"]["unknown"] == 0


def test_tracking_never_keeps_a_model_alive(trace_path):
    """Given a second model found while tracking and then dropped by the script, then it is
    freed during the session (models are held weakly)."""
    student = mlp()
    with rs.track(model=student, out=trace_path):
        ref = copy.deepcopy(student).requires_grad_(False)
        train(student, other=ref)
        alive = weakref.ref(ref)
        del ref
        gc.collect()
        assert alive() is None


def test_the_frame_scan_keeps_no_local_alive():
    """Given a function holding a tensor in a local variable, when its frame is scanned and the
    function then drops the tensor, then the tensor is freed at once: the scan made no
    snapshot of the frame's locals (frame.f_locals does on Python 3.11 and 3.12)."""
    import ridgescope._session as session_module
    scanner = FrameScanner(*session_module._code_roots())

    def holder():
        big = torch.ones(1024)
        model = nn.Linear(2, 2)
        found = scanner.scan(sys._getframe())
        gone = weakref.ref(big)
        del big
        return gone, found, model

    gone, found, model = holder()
    assert gone() is None
    assert any(f.value is model and f.name == "model" for f in found)
    if sys.version_info < (3, 13):
        assert scanner.locals_status == ""  # the C++ reader is in use


@pytest.mark.parametrize("how", ["deepcopy", "assign"])
def test_tracking_a_second_model_changes_no_loss(how, tmp_path):
    """Losses with a second model found and tagged are bitwise those of an untracked run."""
    def run(tracked):
        student = mlp()
        ctx = rs.track(model=student, out=tmp_path / "run.rstrace") if tracked else None
        if ctx:
            ctx.start()
        try:
            if how == "deepcopy":
                other = copy.deepcopy(student).requires_grad_(False)
            else:
                with torch.device("meta"):
                    other = mlp(width=32)
                other.load_state_dict({k: v.clone() for k, v in student.state_dict().items()},
                                      assign=True)
            return [x.hex() for x in train(student, steps=3, other=other)]
        finally:
            if ctx:
                ctx.stop()
    assert run(True) == run(False)



def test_a_steady_run_scans_its_frames_one_step_in_eight_and_still_finds_a_late_copy(trace_path,
                                                                                        monkeypatch):
    """Given a tracked MLP trained 100 steps, with an EMA list of its weights made at step 80
    (after the session's first 64 step ends, when nothing signals a new tensor collection),
    when the run goes on, then the step-end frame scan ran at each of the first 64 step ends and
    at one in eight afterwards, the copy is found within 8 step ends, and it is listed with its
    exact bytes."""
    import ridgescope._models as models_module
    scans = []
    real_scan = FrameScanner.scan
    monkeypatch.setattr(FrameScanner, "scan", lambda self, frame: scans.append(1) or real_scan(self, frame))
    student = mlp()
    opt = torch.optim.AdamW(student.parameters(), lr=1e-2)
    with rs.track(model=student, optimizer=opt, out=trace_path) as s:
        for i in range(100):
            if i == 80:
                shadow = [p.detach().clone() for p in student.parameters()]
            x = torch.randn(8, 16)
            opt.zero_grad()
            student(x).square().mean().backward()
            opt.step()
            if i == 79:
                before_copy = len(scans)
            if i == 80 + models_module.SCAN_EVERY - 1:  # found by the step ends, not by stop
                names = [e.name for e in s._instr.models.entries]
    assert "shadow" in names
    eager = models_module.EAGER_SCANS
    # register_existing's scan, then the first 64 step ends, then one in eight up to step 79
    assert before_copy == 1 + eager + (80 - eager) // models_module.SCAN_EVERY
    models = models_of(s.report())
    assert models["shadow"]["copy_of"] == "student"
    assert models["shadow"]["at_peak"]["parameter_bytes"] == storage_bytes(student.parameters())
    assert len(scans) < 1 + 100  # fewer scans than step ends
    assert shadow
