from django.apps import AppConfig


class CapacityConfig(AppConfig):
    name = "capacity"

    def ready(self) -> None:
        # Fleet serves the join but may not import capacity (capacity reads fleet, not the
        # other way round), so capacity hands it the claim-code redeemer (ESC-03).
        from capacity.claims import redeem_claim_code  # noqa: PLC0415
        from capacity.machines import redeem_machine_claim  # noqa: PLC0415  # in ready(): models
        from fleet.actions import set_claim_redeemer  # noqa: PLC0415  # in ready(): the apps are loaded

        def redeem(*, claim_code: str, name: str, now) -> object:
            # A rented machine's code first (MACH-11's join), then a scale-up event's.
            if redeem_machine_claim(claim_code=claim_code, name=name, now=now):
                return None
            return redeem_claim_code(claim_code=claim_code, name=name, now=now)

        set_claim_redeemer(redeem)
