"""Django loads an app's models from `<app>.models`; the site's own rows (settings values,
leases, the event outbox) live on the ground floor, `zoomies_site.core.models`, where every
app may import them. Nothing imports this module but Django's app loader."""

from zoomies_site.core.models import Event, Lease, SettingValue

__all__ = ["Event", "Lease", "SettingValue"]
