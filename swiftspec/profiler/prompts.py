"""Prompt sets for acceptance profiling: built-in ones shipped with the package, or a JSONL file.

Built-in sets live in `swiftspec/data/prompts/<set>.jsonl` (chat, code, summarisation, math; 10–12
short prompts each, written for swiftspec). A prompts file is JSON Lines, one object per line:

    {"id": "chat-00", "prompt": "How do I ..."}     text, tokenized with the target's tokenizer
    {"id": "raw-00", "tokens": [1, 17, 42]}          token ids, used as they are

`id` is optional. Text prompts get the tokenizer's chat template when it has one (a single user
turn plus the assistant header), so an instruct model answers as it would in a chat.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from swiftspec.spec import UserError, parse_json, read_text

BUILTIN = "builtin"


@dataclass(frozen=True)
class Prompt:
    """One prompt: `text` (to tokenize) or `tokens` (ids), from set `source`."""

    id: str
    text: str | None = None
    tokens: tuple[int, ...] | None = None
    source: str = ""


def _prompts_dir() -> Path:
    return Path(str(resources.files("swiftspec") / "data" / "prompts"))


def builtin_sets() -> list[str]:
    """Names of the built-in prompt sets (chat, code, math, summarisation)."""
    return sorted(p.stem for p in _prompts_dir().glob("*.jsonl"))


def read_jsonl(path: str | Path, source: str | None = None) -> list[Prompt]:
    """Prompts of one JSONL file; a malformed line raises UserError naming the line."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"prompts file {p} not found: give a JSONL file or builtin[:{','.join(builtin_sets())}]")
    out = []
    for n, line in enumerate(read_text(p, "prompts file").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"prompts file {p} line {n}"
        obj = parse_json(line, where)
        if not isinstance(obj, dict):
            raise UserError(f'{where}: expected an object like {{"prompt": "..."}} or {{"tokens": [...]}}')
        text, tokens = obj.get("prompt"), obj.get("tokens")
        if (text is None) == (tokens is None):
            raise UserError(f'{where}: give exactly one of "prompt" (text) or "tokens" (list of ids)')
        if text is not None and (not isinstance(text, str) or not text.strip()):
            raise UserError(f'{where}: "prompt" must be a non-empty string')
        if tokens is not None and (
            not isinstance(tokens, list) or not tokens
            or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in tokens)
        ):
            raise UserError(f'{where}: "tokens" must be a non-empty list of token ids (integers >= 0)')
        out.append(
            Prompt(
                id=_prompt_id(obj.get("id"), f"{p.stem}-{len(out):02d}", where),
                text=text,
                tokens=tuple(tokens) if tokens is not None else None,
                source=source or str(p),
            )
        )
    if not out:
        raise UserError(f"prompts file {p} holds no prompts")
    return out


def _prompt_id(v: object, default: str, where: str) -> str:
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (str, int)):
        raise UserError(f'{where}: "id" must be a string or an integer, got {v!r:.40}')
    return str(v)


def load_prompts(spec: str, limit: int | None = None) -> list[Prompt]:
    """`builtin` (all sets), `builtin:chat,code` or a JSONL path -> prompts.

    With several sets, prompts are interleaved (chat-00, code-00, math-00, ...) so that the first
    `limit` prompts cover every set.
    """
    if spec == BUILTIN or spec.startswith(BUILTIN + ":"):
        names = spec.split(":", 1)[1].split(",") if ":" in spec else builtin_sets()
        unknown = [n for n in names if n not in builtin_sets()]
        if unknown:
            raise UserError(f"unknown built-in prompt set {unknown[0]!r}: choose from {', '.join(builtin_sets())}")
        per_set = [read_jsonl(_prompts_dir() / f"{n}.jsonl", source=f"builtin:{n}") for n in names]
        longest = max(len(s) for s in per_set)
        prompts = [s[i] for i in range(longest) for s in per_set if i < len(s)]
    else:
        prompts = read_jsonl(spec)
    if limit is not None:
        if limit < 1:
            raise UserError(f"number of prompts must be >= 1, got {limit}")
        prompts = prompts[:limit]
    return prompts


def encode(prompt: Prompt, tokenizer, vocab: int) -> list[int]:
    """Token ids of `prompt` (chat template applied when the tokenizer has one).

    tokenizer: a transformers tokenizer or None (then only `tokens` prompts work).
    vocab: the model's vocabulary size; ids must be below it.
    """
    if prompt.tokens is not None:
        ids = list(prompt.tokens)
    elif tokenizer is None:
        raise UserError(f"prompt {prompt.id} is text but the checkpoint has no tokenizer: give token ids")
    elif getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt.text}], add_generation_prompt=True, tokenize=True
        )
        if isinstance(ids, dict) or hasattr(ids, "keys"):  # transformers 5 may return a BatchEncoding
            ids = ids["input_ids"]
        ids = list(ids)
    else:
        ids = list(tokenizer.encode(prompt.text))
    if not ids:
        raise UserError(f"prompt {prompt.id} encodes to no tokens")
    if max(ids) >= vocab:
        raise UserError(f"prompt {prompt.id} has token id {max(ids)} >= the model's vocabulary {vocab}")
    return [int(t) for t in ids]
