"""Proxmox VE: the client (client.py), the machine provider (provider.py), its parameter
checks from the API's own description (schema.py, api-subset.json) and a fake cluster
(fake.py) as strict as the real one (issue 24, MACH-18)."""
