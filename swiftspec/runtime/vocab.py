"""The vocabulary a draft/target pair decodes over: padding rows may differ, token ids may not.

Models of one family often pad their embedding and LM head to different sizes (Qwen2-1.5B has
151,936 rows, Qwen2-72B 152,064, for one tokenizer of about 151,650 tokens). Such a pair decodes
over its *shared ids*, the smaller vocabulary:

  * the draft never proposes an id beyond it (its logits are cut there, `ModelRunner.vocab_limit`);
  * the target's logits are cut there too, in every mode of the pair (the autoregressive baseline
    of a run included), so its argmax or draw is always an id the draft can embed. A real model
    never puts its greedy token on a padding row, so this changes nothing there; random weights
    (or a checkpoint whose extra rows are not padding) can, and then the pair's decoding is
    defined as the target's restricted to the shared ids. Target-only `generate` (no draft) keeps
    the target's whole vocabulary.

A real mismatch (two tokenizers, or special token ids that differ) is refused with one line,
`mismatch_line`, the same for `generate`, `run`, `validate` and `profile acceptance`.
"""

from __future__ import annotations

import json
from pathlib import Path

from swiftspec.runtime.weights import load_tokenizer
from swiftspec.spec import ModelSpec, UserError, resolve_model_path


def mismatch_line(target: str | Path, draft: str | Path, why: str) -> str:
    """The one line every verb refuses a pair with that does not share a vocabulary."""
    return (f"draft {draft} and target {target} do not share a vocabulary ({why}): speculative decoding needs a "
            "draft with the target's tokenizer (vocabularies may differ only by padding rows)")


def _special_ids(folder: Path) -> tuple[int | None, set[int]]:
    """(bos id, eos ids) from a checkpoint's config.json (None / empty when it names none)."""
    try:
        raw = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return None, set()
    bos, eos = raw.get("bos_token_id"), raw.get("eos_token_id")
    eos_ids = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
    return (bos if isinstance(bos, int) else None), {e for e in eos_ids if isinstance(e, int)}


def _mismatch(tfolder: Path, dfolder: Path, shared: int) -> str | None:
    """Why the two checkpoints do not share a vocabulary, or None when nothing says they differ."""
    ttok, dtok = load_tokenizer(tfolder), load_tokenizer(dfolder)
    if ttok is not None and dtok is not None:
        tv, dv = ttok.get_vocab(), dtok.get_vocab()
        if tv != dv:
            return f"their tokenizers differ: {len(tv)} vs {len(dv)} tokens"
        if tv and max(tv.values()) >= shared:
            return f"the tokenizer's ids reach {max(tv.values())}, beyond the smaller vocabulary of {shared} rows"
        return None
    (tbos, teos), (dbos, deos) = _special_ids(tfolder), _special_ids(dfolder)
    if tbos is not None and dbos is not None and tbos != dbos:
        return f"begin-of-text ids {tbos} vs {dbos}"
    if teos and deos and not teos & deos:
        return f"end-of-text ids {sorted(teos)} vs {sorted(deos)}"
    return None


def shared_vocab(target: str | Path, draft: str | Path | None) -> int:
    """The ids the pair decodes over: the smaller of the two vocabularies (the target's without a
    draft). Reads configs and tokenizers only (no weights), so verbs call it before building models.
    Raises `UserError(mismatch_line(...))` when the pair does not share a vocabulary (module docstring)."""
    tv = ModelSpec.from_config(target).vocab
    if draft is None:
        return tv
    dv = ModelSpec.from_config(draft).vocab
    shared = min(tv, dv)
    tfolder, dfolder = resolve_model_path(target), resolve_model_path(draft)
    if tfolder.resolve() == dfolder.resolve():
        return shared
    why = _mismatch(tfolder, dfolder, shared)
    if why is not None:
        raise UserError(mismatch_line(target, draft, why))
    return shared


def vocab_cut(model_vocab: int, shared: int | None) -> int | None:
    """The `ModelRunner.vocab_limit` of a model in a pair: `shared` when its own vocabulary is
    larger (its extra rows are padding), else None (no cut)."""
    return shared if shared is not None and model_vocab > shared else None
