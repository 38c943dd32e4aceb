"""Machine providers: the contract a provider implements (`contract`), a fake that obeys it
and can misbehave on request (`fake`), and the providers themselves (`local`; Proxmox next).
"""
