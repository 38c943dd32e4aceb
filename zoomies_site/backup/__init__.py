"""Backups of the database: taking, describing, verifying, encrypting, copying to
S3-compatible remotes and restoring (BAK-01..06). `service` is the one entry point that the
`backup` and `restore` commands, the API and the scheduled task all call."""
