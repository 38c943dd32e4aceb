from django.apps import AppConfig


class RunnersConfig(AppConfig):
    name = "runners"

    def ready(self) -> None:
        # The fleet floor reports host facts through its one door; this app answers them.
        from fleet import runner_side  # noqa: PLC0415  # models need the apps loaded
        from runners import host_facts  # noqa: PLC0415  # it imports the models

        runner_side.register(host_facts)
