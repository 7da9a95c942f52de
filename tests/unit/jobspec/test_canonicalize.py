"""``canonicalize=True`` fills the api package's defaults and keeps what the jobspec set."""

from __future__ import annotations

from llmgw.apispec import check_document
from llmgw.apispec.jobspec import parse_jobspec

S = 1_000_000_000


def test_service_job_defaults() -> None:
    job = parse_jobspec(
        'job "j" {\n  update {\n    max_parallel = 2\n  }\n'
        '  group "g" {\n    task "t" {\n      driver = "docker"\n    }\n  }\n}\n',
        canonicalize=True,
    )
    assert job["Region"] == "global"
    assert job["Namespace"] == "default"
    assert job["Priority"] == 50
    assert job["Type"] == "service"
    assert job["Update"] == {
        "Stagger": 30 * S,
        "MaxParallel": 2,
        "HealthCheck": "checks",
        "MinHealthyTime": 10 * S,
        "HealthyDeadline": 300 * S,
        "ProgressDeadline": 600 * S,
        "AutoRevert": False,
        "Canary": 0,
        "AutoPromote": False,
    }
    [group] = job["TaskGroups"]  # type: ignore[misc]
    assert group["Count"] == 1
    assert group["EphemeralDisk"] == {"Sticky": False, "Migrate": False, "SizeMB": 300}
    assert group["RestartPolicy"]["Attempts"] == 2
    assert group["ReschedulePolicy"]["Unlimited"] is True
    [task] = group["Tasks"]
    assert task["KillTimeout"] == 5 * S
    assert task["Resources"] == {"CPU": 100, "Cores": 0, "MemoryMB": 300}
    assert task["LogConfig"] == {"MaxFiles": 10, "MaxFileSizeMB": 10, "Disabled": False}
    assert check_document(job, "Job") == []


def test_batch_jobs_get_batch_restart_and_reschedule_and_no_update() -> None:
    job = parse_jobspec(
        'job "j" {\n  type = "batch"\n  group "g" {\n    restart {\n      attempts = 9\n    }\n  }\n}\n',
        canonicalize=True,
    )
    assert "Update" not in job
    [group] = job["TaskGroups"]  # type: ignore[misc]
    assert group["RestartPolicy"]["Attempts"] == 9
    assert group["RestartPolicy"]["Interval"] == 86400 * S
    assert group["ReschedulePolicy"]["DelayFunction"] == "constant"


def test_without_canonicalize_nothing_is_filled() -> None:
    job = parse_jobspec('job "j" {\n  group "g" {\n  }\n}\n')
    assert job == {"ID": "j", "Name": "j", "TaskGroups": [{"Name": "g"}]}
