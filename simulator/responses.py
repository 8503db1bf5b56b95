"""Non-streaming response bodies: chat and text completions, and the model list."""

from __future__ import annotations

from typing import Any

from simulator.schemas import encoder
from simulator.sse import usage


def completion_body(
    response_id: str,
    created: int,
    model: str,
    *,
    chat: bool,
    text: str,
    finish_reason: str,
    prompt: int,
    completion: int,
    cached: int | None,
    thought: tuple[str, str] | None = None,
) -> bytes:
    """A ``chat.completion`` or ``text_completion`` object; ``thought``: a reasoning model's
    (field, thinking), the thinking kept out of ``content`` (``null`` when nothing is left)."""
    choice: dict[str, Any]
    if chat:
        choice = {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": text,
                "refusal": None,
                "tool_calls": [],
                "reasoning_content": None,
            },
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": None,
        }
        if thought is not None:
            field, thinking = thought
            choice["message"][field] = thinking
            choice["message"]["content"] = text or None
    else:
        choice = {
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": None,
            "prompt_logprobs": None,
        }
    counts = usage(prompt, completion, cached)
    counts.setdefault("prompt_tokens_details", None)  # non-streaming replies carry a null
    return encoder.encode(
        {
            "id": response_id,
            "object": "chat.completion" if chat else "text_completion",
            "created": created,
            "model": model,
            "choices": [choice],
            "usage": counts,
            "prompt_logprobs": None,
        }
    )


def models_body(model: str, created: int, max_model_len: int, *, owned_by: str = "vllm") -> bytes:
    """``GET /v1/models``: the one served model, in vLLM's shape (``owned_by``: the server)."""
    card = {
        "id": model,
        "object": "model",
        "created": created,
        "owned_by": owned_by,
        "root": model,
        "parent": None,
        "max_model_len": max_model_len,
        "permission": [
            {
                "id": f"modelperm-{model}",
                "object": "model_permission",
                "created": created,
                "allow_create_engine": False,
                "allow_sampling": True,
                "allow_logprobs": True,
                "allow_search_indices": False,
                "allow_view": True,
                "allow_fine_tuning": False,
                "organization": "*",
                "group": None,
                "is_blocking": False,
            }
        ],
    }
    return encoder.encode({"object": "list", "data": [card]})
