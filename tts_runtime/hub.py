"""Hugging Face Hub repositories as local folders: models and datasets alike, through the
Hugging Face cache (HF_HOME / HF_HUB_CACHE, HF_TOKEN and HF_HUB_OFFLINE apply), with a
one-line error for each way a download can fail."""

from __future__ import annotations

import re
from pathlib import Path

from tts_runtime.options import ConfigError

# org/name, optionally @revision (a branch, tag or commit)
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+(@[\w./-]+)?")
# What each kind of repository is called in a message, and what to pass instead of it.
_KINDS = {"model": ("licence", "local folder", "", "pass a local folder"),
          "dataset": ("terms", "local file", " --repo-type dataset", "pass a JSONL file")}


def hub_snapshot(repo_id: str, revision: str | None = None, *, kind: str = "model",
                 allow_patterns: list[str] | None = None, error: type[ConfigError] = ConfigError) -> Path:
    """The local folder of a Hub repository (`kind`: model or dataset) at `revision`,
    downloaded into the cache if it is not there; `error` is the one-line error raised."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (GatedRepoError, HfHubHTTPError, LocalEntryNotFoundError,
                                        RepositoryNotFoundError, RevisionNotFoundError)

    agreement, local, cli_flag, instead = _KINDS[kind]
    at = f"{repo_id}@{revision}" if revision else repo_id
    try:
        return Path(snapshot_download(repo_id, repo_type=kind, revision=revision, allow_patterns=allow_patterns))
    except GatedRepoError:
        raise error(f"{kind} {at} is gated on the Hugging Face Hub: accept its {agreement} on its page, "
                    "then set HF_TOKEN to a token of that account") from None
    except RepositoryNotFoundError:
        raise error(f"unknown {kind} '{at}': no such repository on the Hugging Face Hub (a private one "
                    f"needs HF_TOKEN), and no {local} of that name") from None
    except RevisionNotFoundError:
        raise error(f"{kind} {repo_id} has no revision '{revision}' on the Hugging Face Hub") from None
    except LocalEntryNotFoundError:
        raise error(f"{kind} {at} is not in the Hugging Face cache and the Hub cannot be reached "
                    f"(offline, or HF_HUB_OFFLINE=1): download it where the Hub is reachable "
                    f"(huggingface-cli download{cli_flag}), or {instead}") from None
    except HfHubHTTPError as exc:
        raise error(f"cannot download {kind} {at} from the Hugging Face Hub: {str(exc).splitlines()[0]}") \
            from None
