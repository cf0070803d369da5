"""Direct preference optimisation of a causal LM against a frozen reference copy of itself,
written the way TRL's DPOTrainer computes it (create_reference_model: a deepcopy with
requires_grad off, in eval mode; the sigmoid DPO loss on summed completion log-probs of the
chosen and rejected answers, the policy's forward first, the reference's under no_grad), on a
transformers GPT-2 built from a tiny config, random token pairs and three steps."""
from copy import deepcopy

import torch
import torch.nn.functional as F
from transformers import GPT2Config, GPT2LMHeadModel

from field_truth import write_truth


def create_reference_model(model):
    ref_model = deepcopy(model)
    for param in ref_model.parameters():
        param.requires_grad = False
    return ref_model.eval()


def completion_logps(model, input_ids, attention_mask, prompt_len):
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1]
    labels = input_ids[:, 1:]
    per_token = torch.gather(logits.log_softmax(-1), 2, labels.unsqueeze(2)).squeeze(2)
    mask = attention_mask[:, 1:].clone()
    mask[:, : prompt_len - 1] = 0
    return (per_token * mask).sum(-1)


def concatenated_forward(model, batch, prompt_len):
    ids = torch.cat([batch["chosen_input_ids"], batch["rejected_input_ids"]])
    mask = torch.cat([batch["chosen_attention_mask"], batch["rejected_attention_mask"]])
    logps = completion_logps(model, ids, mask, prompt_len)
    n = batch["chosen_input_ids"].shape[0]
    return logps[:n], logps[n:]


def main():
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=128, n_positions=32, n_embd=32, n_layer=2, n_head=2,
                        bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(config)
    ref_model = create_reference_model(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5)
    beta, prompt_len, batch_size, seq_len = 0.1, 6, 4, 16

    model.train()
    for step in range(3):
        batch = {
            "chosen_input_ids": torch.randint(0, config.vocab_size, (batch_size, seq_len)),
            "rejected_input_ids": torch.randint(0, config.vocab_size, (batch_size, seq_len)),
            "chosen_attention_mask": torch.ones(batch_size, seq_len, dtype=torch.long),
            "rejected_attention_mask": torch.ones(batch_size, seq_len, dtype=torch.long),
        }
        chosen_logps, rejected_logps = concatenated_forward(model, batch, prompt_len)
        with torch.no_grad():
            ref_chosen_logps, ref_rejected_logps = concatenated_forward(ref_model, batch, prompt_len)
        logits = (chosen_logps - rejected_logps) - (ref_chosen_logps - ref_rejected_logps)
        loss = -F.logsigmoid(beta * logits).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        print(f"step {step} loss {loss.item()!r}")

    write_truth(model=model, ref_model=ref_model)


if __name__ == "__main__":
    main()
