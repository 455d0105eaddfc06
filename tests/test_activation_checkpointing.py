"""train.activation_checkpointing: each block recomputed in the backward pass gives the gradients
of the ordinary pass (dropout included: the masks are drawn again alike), keeps fewer tensors
for the backward pass, and trains through the loop."""

import pytest
import torch
import torch.nn.functional as F

from minilm import GPT, ModelConfig
from minilm.common import saved_tensor_bytes
from minilm.training.loop import train


def gradients(position, checkpointed, dropout=0.1, seed=0):
    torch.manual_seed(seed)
    model = GPT(
        ModelConfig(vocab_size=61, n_layer=3, n_head=4, d_model=32, block_size=32, dropout=dropout, position=position)
    ).train()
    model.checkpoint_blocks = checkpointed
    idx = torch.randint(0, 61, (3, 33), generator=torch.Generator().manual_seed(1))
    torch.manual_seed(seed + 1)  # the dropout masks
    loss = F.cross_entropy(model(idx[:, :-1]).flatten(0, 1), idx[:, 1:].flatten())
    loss.backward()
    return loss.item(), {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize(
    "position", [{"kind": "rope"}, {"kind": "alibi"}, {"kind": "shaw"}, {"kind": "learned"}, {"kind": "t5"}]
)
def test_checkpointed_blocks_give_the_same_gradients(position):
    loss, plain = gradients(position, False)
    again, checkpointed = gradients(position, True)
    assert again == loss
    for name, grad in plain.items():
        torch.testing.assert_close(checkpointed[name], grad, rtol=1e-6, atol=1e-6, msg=name)


def saved_bytes(checkpointed: bool, T: int = 256) -> int:
    """Bytes of the tensors autograd keeps for the backward pass of one forward pass."""
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=61, n_layer=4, n_head=4, d_model=64, block_size=T)).train()
    model.checkpoint_blocks = checkpointed
    return saved_tensor_bytes(lambda: model(torch.zeros(2, T, dtype=torch.long)))[0]


def test_checkpointing_keeps_fewer_activations():
    assert saved_bytes(True) < 0.5 * saved_bytes(False)


def test_a_run_with_activation_checkpointing_follows_the_plain_one(tiny_config):
    finals = []
    for checkpointed in (False, True):
        config = tiny_config(
            "train.max_steps=3",
            f"train.activation_checkpointing={str(checkpointed).lower()}",
            "model.dropout=0.1",
            out=f"run-{checkpointed}",
        )
        finals.append(train(config, quiet=True))
    assert finals[0]["final_val_loss"] is not None
    assert finals[1]["final_val_loss"] == pytest.approx(finals[0]["final_val_loss"], rel=1e-5)


def test_saved_tensor_bytes_counts_each_storage_once():
    x = torch.ones(1000, requires_grad=True)  # float32: 4,000 bytes
    # x * x keeps x twice (one storage); exp keeps its output (another 4,000 bytes)
    saved, out = saved_tensor_bytes(lambda: (x * x).exp())
    assert saved == 8000 and out.shape == (1000,)
