"""The operator settings registry (CONF-01..07).

Every operator-facing tunable is a typed entry here with a default, a range or validator and
one sentence of help that the Settings page shows. Values come from four layers, a later one
overriding an earlier one (CONF-02):

    defaults < zoomies.yaml < the database (SettingValue rows) < ZOOMIES_* environment

`zoomies.yaml` (``settings.ZOOMIES_CONFIG_FILE``) may nest (``scheduler: {provision_timeout:
30m}``) or use dotted keys (``scheduler.provision_timeout: 30m``); a missing file is fine, an
unknown key is a warning. Each entry's variable is ``ZOOMIES_`` plus its key upper-cased with
dots as underscores; an empty variable counts as unset. A secret entry also reads
``<VAR>_FILE`` (a list secret takes one item per line there), unless that name is another
entry's own variable. A list in a variable is comma separated, or a JSON array when an item
needs a comma.

A secret entry's database value is sealed (AUTH-07): its row holds ``{"sealed": "v1:..."}``,
the JSON sealed with AES-256-GCM by `core.sealing`, and is opened when the layer is read.
A row that cannot be opened (another key, altered) is an error finding, not a crash.

A value that does not parse or is out of range never crashes anything: the layer below it stays
in force and validation reports an error finding, which stops startup (CONF-04).

Durations are ``timedelta``; they accept ``90s``, ``20m``, ``1h``, ``1h30m``, ``500ms`` or a
number of seconds. `describe()` renders them back in that form (``20m``).

The layered values are cached per process for `CACHE_SECONDS`, so `get()` costs no query;
`reload()` drops the cache (`actions.set_setting` calls it on commit). The database layer is
one SELECT, and it is a synchronous ORM call: from async code use ``sync_to_async(get)``.
"""

# The package is split along its sections: what a setting is (types), the entries, the
# layers and their cache, and validation. This module is the one name callers import.
from zoomies_site.core.registry.entries import DERIVED, ENTRIES, KEYS, SETTINGS, entry
from zoomies_site.core.registry.layers import (
    SEALED,
    Values,
    current,
    describe,
    from_stored,
    get,
    get_all,
    is_sealed,
    key_source,
    layered,
    reload,
    to_stored,
)
from zoomies_site.core.registry.types import (
    BOOL,
    CACHE_SECONDS,
    CHOICE,
    DERIVED_SOURCE,
    DURATION,
    ENV_PREFIX,
    FLOAT,
    INT,
    LIST,
    MASK,
    SOURCES,
    STR,
    TYPES,
    ConfigError,
    Derived,
    Setting,
    UnknownSetting,
    env_name,
    format_duration,
    is_loopback,
    parse_duration,
    split_bind,
)
from zoomies_site.core.registry.validation import raise_for_errors, validate

__all__ = [
    "BOOL",
    "CACHE_SECONDS",
    "CHOICE",
    "DERIVED",
    "DERIVED_SOURCE",
    "DURATION",
    "ENTRIES",
    "ENV_PREFIX",
    "FLOAT",
    "INT",
    "KEYS",
    "LIST",
    "MASK",
    "SEALED",
    "SETTINGS",
    "SOURCES",
    "STR",
    "TYPES",
    "ConfigError",
    "Derived",
    "Setting",
    "UnknownSetting",
    "Values",
    "current",
    "describe",
    "entry",
    "env_name",
    "format_duration",
    "from_stored",
    "get",
    "get_all",
    "is_loopback",
    "is_sealed",
    "key_source",
    "layered",
    "parse_duration",
    "raise_for_errors",
    "reload",
    "split_bind",
    "to_stored",
    "validate",
]
