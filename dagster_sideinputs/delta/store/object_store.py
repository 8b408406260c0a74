"""Conditional writes on object stores (create-only, compare-and-swap), through obstore.

delta-rs's Python API does not expose them; ``obstore`` binds the same Rust
``object_store`` crate delta-rs uses, configured here from the same storage options
(:func:`object_store_options`). S3 (``If-None-Match`` / ``If-Match``), GCS
(generations) and Azure (ETags) all evaluate those conditions atomically.
"""

import functools
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlparse

import obstore
from obstore.exceptions import (
    AlreadyExistsError,
    NotFoundError,
    PreconditionError,
    UnknownConfigurationKeyError,
)
from obstore.store import from_url

# obstore types its settings as provider-specific TypedDicts; ours come as plain maps.
_store_from_url: Callable[..., Any] = from_url


# object_store's HTTP client settings; delta-rs takes them in the same flat map as the
# store's settings (with or without a provider prefix), obstore wants them apart.
_CLIENT_KEYS = frozenset(
    {
        "allow_http",
        "allow_invalid_certificates",
        "connect_timeout",
        "default_content_type",
        "http1_only",
        "http2_only",
        "http2_keep_alive_interval",
        "http2_keep_alive_timeout",
        "http2_keep_alive_while_idle",
        "http2_max_frame_size",
        "pool_idle_timeout",
        "pool_max_idle_per_host",
        "proxy_url",
        "proxy_ca_certificate",
        "proxy_excludes",
        "randomize_addresses",
        "read_timeout",
        "timeout",
        "user_agent",
    }
)
_PROVIDER_PREFIXES = ("aws_", "google_", "azure_")
_CONFLICT_RETRIES = 8


def _client_key(key: str) -> str | None:
    lowered = key.lower()
    for prefix in _PROVIDER_PREFIXES:
        if lowered.startswith(prefix):
            lowered = lowered[len(prefix) :]
            break
    return lowered if lowered in _CLIENT_KEYS else None


@functools.lru_cache(maxsize=256)
def _store_accepts(scheme_root: str, key: str, value: str) -> bool:
    """Whether obstore knows a configuration key (delta-rs accepts keys it does not)."""
    try:
        _store_from_url(scheme_root, config={key: value})
    except UnknownConfigurationKeyError:
        return False
    except Exception:
        # A known key whose companion is missing (a key id without its secret) fails to
        # build on its own: it is still a key of the store.
        return True
    except BaseException as exc:
        # obstore panics on an HTTP client key passed as store config; _CLIENT_KEYS routes
        # the known ones apart, and one it does not list is left out.
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            raise
        return False
    return True


def object_store_options(
    uri: str, storage_options: Mapping[str, str]
) -> tuple[dict[str, str], dict[str, str]]:
    """Split delta-rs storage options into obstore's store config and client options.

    Options only delta-rs understands (``AWS_S3_LOCKING_PROVIDER``,
    ``AWS_S3_ALLOW_UNSAFE_RENAME``, ``max_retries``, ...) are left out; they tune
    delta-rs's own commit loop, not how to reach the store.

    Returns:
        (config, client_options) for ``obstore.store.from_url``.
    """
    parsed = urlparse(uri)
    scheme_root = f"{parsed.scheme}://{parsed.netloc}"
    config: dict[str, str] = {}
    client: dict[str, str] = {}
    for key, value in storage_options.items():
        client_key = _client_key(key)
        if client_key is not None:
            client[client_key] = value
        elif _store_accepts(scheme_root, key, value):
            config[key] = value
    return config, client


def retry_config(storage_options: Mapping[str, str]) -> dict[str, Any] | None:
    """obstore's retry settings from delta-rs's ``max_retries`` option (the same key, so
    that the lease, conditional writes and delta-rs give up on a store that is down after
    as many attempts); None: object_store's defaults (10 retries, up to 3 minutes)."""
    raw = next((v for k, v in storage_options.items() if k.lower() == "max_retries"), None)
    if raw is None or not str(raw).strip().isdigit():
        return None
    return {"max_retries": int(raw)}


def open_object_store(uri: str, storage_options: Mapping[str, str]) -> Any:
    """An ``obstore`` store rooted at ``uri`` (``s3://``, ``gs://``, ``az://``, ...)."""
    config, client = object_store_options(uri, storage_options)
    # s3a:// is Hadoop's name for s3://; obstore knows both, say it plainly anyway.
    if uri.startswith("s3a://"):
        uri = "s3://" + uri[len("s3a://") :]
    return _store_from_url(
        uri,
        config=config or None,
        client_options=client or None,
        retry_config=retry_config(storage_options),
    )


def put_if_absent(store: Any, path: str, data: bytes) -> bool:
    """Create an object only if it does not exist, atomically on the store's side.

    Of any number of racing writers exactly one gets True. A caller that gets False must
    read what is there: when the store's answer to a successful create is lost, the HTTP
    client's retry meets the object and reports it as existing, so it may be its own.

    Returns:
        False when the object already existed (nothing written).
    """
    for attempt in range(_CONFLICT_RETRIES):
        try:
            obstore.put(store, path, data, mode="create")
            return True
        except AlreadyExistsError:
            return False
        except PreconditionError:
            # S3 answers 409 ConditionalRequestConflict while another conditional write
            # of the same key is in flight; its outcome decides, so ask again.
            if attempt == _CONFLICT_RETRIES - 1:
                if _exists(store, path):
                    return False
                raise
            time.sleep(0.05 * (attempt + 1))
    raise AssertionError("unreachable")


def _version_of(meta: Mapping[str, Any]) -> dict[str, str]:
    """What a compare-and-swap must match: the ETag (S3, Azure) and the version (GCS's
    generation), as far as the store gives them."""
    return {key: str(meta[key]) for key in ("e_tag", "version") if meta.get(key)}


def _put_matching(store: Any, path: str, data: bytes, version: Mapping[str, str] | None) -> Any:
    """PUT only if the object is still at ``version`` (compare-and-swap)."""
    mode: Any = dict(version or {})  # obstore's UpdateVersion TypedDict
    return obstore.put(store, path, data, mode=mode)


def _exists(store: Any, path: str) -> bool:
    try:
        obstore.head(store, path)
    except (FileNotFoundError, NotFoundError):
        return False
    return True
