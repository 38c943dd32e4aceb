from django.apps import AppConfig


class CapacityConfig(AppConfig):
    name = "capacity"

    def ready(self) -> None:
        # Fleet serves the join but may not import capacity (capacity reads fleet, not the
        # other way round), so capacity hands it the claim-code redeemer (ESC-03).
        from capacity.claims import redeem_claim_code  # noqa: PLC0415
        from fleet.actions import set_claim_redeemer  # noqa: PLC0415  # in ready(): the apps are loaded

        set_claim_redeemer(redeem_claim_code)
