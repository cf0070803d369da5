"""Specification of what a DataLoader's dataset holds (python/ridgescope/_data.py): the
``input`` category, not ``unknown`` (docs/categories.md).

Scenario (the Lightning trial's gap: a 262 KiB TensorDataset stayed unknown, 7.5 % of that
run's peak): a TensorDataset made before the training loop, iterated by a DataLoader. The
truth is the dataset's own tensors (numel x element size)."""
from __future__ import annotations

import pytest
import torch
from torch.utils.data import ConcatDataset, DataLoader, Dataset, Subset, TensorDataset

import ridgescope as rs
from ridgescope import _data
from conftest import make_mlp


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def make_dataset() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(1024, 128, generator=g),
                         torch.randint(0, 10, (1024,), generator=g))


def train_from(loader: DataLoader, model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    for x, y in loader:
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


def dataset_blocks(report: rs.Report) -> dict[str, dict]:
    return {b["label"]: b for b in report.peak["top_blocks"] if b["label"].startswith("dataset ")}


@pytest.mark.parametrize("made", ["while tracking", "before tracking"])
def test_a_tensor_datasets_tensors_are_input(made, tmp_path):
    """Given a TensorDataset made before the loop (inside the session, or before it started),
    when a DataLoader iterates it, then its tensors are input at their exact size, named after
    the dataset, and nothing at the peak is unknown."""
    model = make_mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = make_dataset() if made == "before tracking" else None
    with rs.track(model=model, optimizer=opt, out=tmp_path / "run.rstrace") as session:
        data = data if data is not None else make_dataset()
        train_from(DataLoader(data, batch_size=256), model, opt)
    report = session.report()
    held = dataset_blocks(report)
    assert held["dataset TensorDataset.tensors[0]"]["bytes"] == nbytes(data.tensors[0])
    assert held["dataset TensorDataset.tensors[1]"]["bytes"] == nbytes(data.tensors[1])
    assert {b["category"] for b in held.values()} == {"input"}
    assert report.peak["by_category"]["input"] >= sum(nbytes(t) for t in data.tensors)
    assert report.peak["by_category"]["unknown"] == 0


class Tokens(Dataset):
    """A dataset class of one's own: a tensor, a dict of tensors, a list, and other things."""

    def __init__(self) -> None:
        self.ids = torch.arange(64).reshape(8, 8)
        self.view = self.ids[2:]                      # the same storage: counted once
        self.columns = {"mask": torch.ones(8, 8, dtype=torch.bool), "name": "tokens"}
        self.shards = [torch.zeros(4), torch.zeros(6)]
        self.meta = {"nested": {"too_deep": torch.zeros(3)}}  # two containers down: not looked at
        self.size = 8

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.ids[i]


def test_what_a_dataset_holds():
    """Given datasets of several shapes, then the tensors found are those they hold, each
    storage once, labelled by where they sit."""
    found = dict(_data.dataset_tensors(Tokens()))
    assert set(found) == {"Tokens.ids", "Tokens.columns['mask']", "Tokens.shards[0]",
                          "Tokens.shards[1]"}
    inner = TensorDataset(torch.zeros(5, 2), torch.zeros(5))
    nested = Subset(ConcatDataset([inner, Tokens()]), [0, 1, 2])
    labels = [label for label, _ in _data.dataset_tensors(nested)]
    assert labels[:2] == ["Subset.dataset.datasets[0].tensors[0]",
                          "Subset.dataset.datasets[0].tensors[1]"]
    assert "Subset.dataset.datasets[1].ids" in labels
    # a plain list of examples (what a Trainer takes): rows of one tensor, its storage once
    ids = torch.zeros(4, 8, dtype=torch.long)
    rows = [{"input_ids": row, "labels": row} for row in ids]
    assert [label for label, _ in _data.dataset_tensors(rows)] == ["list[0]['input_ids']"]


def test_the_scan_is_bounded(monkeypatch):
    """Given a dataset holding more tensors than the bound, then only the bound is taken."""
    monkeypatch.setattr(_data, "MAX_TENSORS", 3)

    class Many(Dataset):
        def __init__(self) -> None:
            self.items = [torch.zeros(2) for _ in range(10)]

    assert len(list(_data.dataset_tensors(Many()))) == 3


def test_dataloaders_are_left_as_they_were():
    """Given a session that ran, then DataLoader iteration is torch's own again."""
    original = DataLoader.__iter__
    with rs.track():
        assert DataLoader.__iter__ is not original
        assert list(DataLoader(TensorDataset(torch.zeros(4, 2)), batch_size=2))
    assert DataLoader.__iter__ is original
