"""Drop the stored credential of every task already final.

Until now a housekeeping sweep dropped `env` from final tasks on every tick; now the move to
a final state drops it in the same UPDATE (fleet.transitions.transition_task), and nothing
sweeps. This catches the rows that finished before the change.
"""

from django.db import migrations

FINAL = ("done", "failed", "abandoned", "cancelled")


def drop_env(apps, schema_editor):
    AgentTask = apps.get_model("fleet", "AgentTask")
    for task in AgentTask.objects.filter(state__in=FINAL).only("pk", "payload").iterator():
        payload = task.payload
        if not isinstance(payload, dict) or "env" not in payload:
            continue
        payload = dict(payload)
        env = payload.pop("env")
        if isinstance(env, dict):
            payload["env_keys"] = sorted(env)
        AgentTask.objects.filter(pk=task.pk).update(payload=payload)


class Migration(migrations.Migration):
    dependencies = [("fleet", "0002_initial")]

    operations = [migrations.RunPython(drop_env, migrations.RunPython.noop)]
