"""Reference log-probs for the rollout tests, computed independently of the engine's KV-cached sampling loop."""

import torch


def forward_log_probs(engine, prompt: list[int], response: list[int], temperature: float,
                      kept_ids: list[list[int]] | None) -> list[float]:
    """log softmax(logits / T) of each response token from one forward pass over prompt + response, renormalized over
    the kept ids when the engine sampled from a truncated set: independent of the engine's KV-cached loop."""
    with torch.no_grad():
        logits = engine.model(input_ids=torch.tensor([prompt + response])).logits[0, len(prompt) - 1:-1] / temperature
    if kept_ids is not None:
        mask = torch.full_like(logits, float("-inf"))
        for position, ids in enumerate(kept_ids):
            mask[position, ids] = 0.0
        logits = logits + mask
    return torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(response)[:, None]).squeeze(1).tolist()
