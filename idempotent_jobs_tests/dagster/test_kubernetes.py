"""Kubernetes on paper, checked offline: deploy/kubernetes against dagster-k8s and the schemas.

No cluster is needed. The run configuration goes through Dagster's own config system; the run
worker's Kubernetes Job comes from the real ``K8sRunLauncher.launch_run`` (its batch API
replaced by one that keeps the Job instead of sending it), a step's Job from the
``k8s_job_executor``'s own step handler and dagster-k8s's builder; both Jobs and their Pods are
checked by ``kubernetes-validate --strict``, and must carry the ledger's Secret and environment.

The lease hand-over between ops in different pods is what the multiprocess and Celery tests
prove between processes (``test_dagster_instance.py::
test_the_multiprocess_executor_hands_the_lease_over_between_processes``
and ``test_celery.py``): a step holds no state of its own but the ``Ticket`` it loads.
"""

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import dagster as dg
import pytest
import yaml
from dagster._config import validate_config
from dagster._core.definitions.reconstruct import ReconstructableRepository
from dagster._core.launcher import LaunchRunContext
from dagster_k8s import K8sRunLauncher
from kubernetes.client import ApiClient  # type: ignore[import-untyped]

from idempotent_jobs.core.constants import DATABASE_URL_ENV
from idempotent_jobs.location.kubernetes import defs
from testkit.dagster_harness import PROJECT_ROOT

DEPLOY = PROJECT_ROOT / "deploy" / "kubernetes"
IMAGE = "registry.example/idempotent-jobs:1.0"
SECRET = "idempotent-jobs-ledger"
PARTITION = "workspace-acme|2026-08-07"
OFFLINE_KUBECONFIG = {
    "apiVersion": "v1",
    "kind": "Config",
    "clusters": [{"name": "offline", "cluster": {"server": "https://127.0.0.1:9"}}],
    "users": [{"name": "offline", "user": {"token": "offline"}}],
    "contexts": [{"name": "offline", "context": {"cluster": "offline", "user": "offline"}}],
    "current-context": "offline",
}


def launcher_config() -> dict[str, Any]:
    instance = yaml.safe_load((DEPLOY / "dagster.yaml").read_text())
    launcher = instance["run_launcher"]
    assert (launcher["module"], launcher["class"]) == ("dagster_k8s", "K8sRunLauncher")
    return dict(launcher["config"])


@pytest.fixture(autouse=True)
def pod_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the Secret puts in a pod's environment (the resources read it through EnvVar)."""
    monkeypatch.setenv(DATABASE_URL_ENV, "postgresql://worker@ledger.example:5432/ledger")


class KeptJobs:
    """A batch API that keeps the Jobs it is asked to create."""

    def __init__(self) -> None:
        self.jobs: list[Any] = []

    def create_namespaced_job(self, body: Any, namespace: str, **_: Any) -> Any:
        self.jobs.append((namespace, body))
        return body


@pytest.fixture
def k8s_instance(tmp_path: Path) -> Iterator[dg.DagsterInstance]:
    """An instance whose run launcher is deploy/kubernetes/dagster.yaml's, with a kubeconfig that
    points nowhere (the launcher loads one; nothing is sent)."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(OFFLINE_KUBECONFIG))
    config = {
        **launcher_config(),
        "load_incluster_config": False,
        "kubeconfig_file": str(kubeconfig),
    }
    launcher = {"module": "dagster_k8s", "class": "K8sRunLauncher", "config": config}
    with dg.instance_for_test(overrides={"run_launcher": launcher}) as instance:
        yield instance


def validate_strictly(objects: list[dict[str, Any]], tmp_path: Path) -> None:
    files = []
    for number, obj in enumerate(objects):
        path = tmp_path / f"object-{number}.yaml"
        path.write_text(yaml.safe_dump(obj))
        files.append(str(path))
    checked = subprocess.run(
        [str(Path(sys.executable).with_name("kubernetes-validate")), "--strict", *files],
        capture_output=True,
        text=True,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def job_and_pod(job: Any) -> list[dict[str, Any]]:
    rendered: dict[str, Any] = ApiClient().sanitize_for_serialization(job)
    template = rendered["spec"]["template"]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": template["metadata"],
        "spec": template["spec"],
    }
    return [rendered, pod]


def assert_ledger_config_reaches(pod: dict[str, Any]) -> None:
    [container] = pod["spec"]["containers"]
    assert container["image"] == IMAGE
    assert {"secretRef": {"name": SECRET}} in container.get("envFrom", []), container
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["PGSSLMODE"] == "require" and env["PGCONNECT_TIMEOUT"] == "10"
    assert "IDEMPOTENT_JOBS_DATABASE_URL" not in env, "the URL comes from the Secret only"
    assert container["securityContext"]["runAsNonRoot"] is True


def test_the_instance_and_run_configuration_pass_dagsters_own_config_system() -> None:
    checked = validate_config(K8sRunLauncher.config_type(), launcher_config())  # type: ignore[no-untyped-call]
    assert checked.success, checked.errors
    run_config = yaml.safe_load((DEPLOY / "run_config.yaml").read_text())
    for job in ("competitor_summary", "hourly_digest"):
        job_def = defs.resolve_job_def(job)
        assert job_def.executor_def.name == "k8s"
        dg.validate_run_config(job_def, run_config)  # raises DagsterInvalidConfigError
        dg.validate_run_config(job_def, {})  # what schedules and backfills launch with
    with pytest.raises(dg.DagsterInvalidConfigError):
        dg.validate_run_config(
            defs.resolve_job_def("competitor_summary"),
            {"execution": {"config": {"per_step_k8s_config": {"transform": {"memory": "2Gi"}}}}},
        )


def test_the_run_and_step_pods_are_valid_kubernetes_and_carry_the_ledger_secret(
    k8s_instance: dg.DagsterInstance, tmp_path: Path
) -> None:
    job_def = defs.resolve_job_def("competitor_summary")
    origin = (
        ReconstructableRepository.for_module(
            "idempotent_jobs.location.kubernetes", "defs", str(PROJECT_ROOT), container_image=IMAGE
        )
        .get_reconstructable_job("competitor_summary")
        .get_python_origin()
    )
    run = k8s_instance.create_run_for_job(
        job_def, tags={"dagster/partition": PARTITION}, job_code_origin=origin
    )
    launcher = k8s_instance.run_launcher
    assert isinstance(launcher, K8sRunLauncher)
    kept = KeptJobs()
    launcher._api_client.batch_api = kept  # noqa: SLF001 - the one call that would leave the machine
    launcher.launch_run(LaunchRunContext(dagster_run=run, workspace=None))
    [(namespace, run_job)] = kept.jobs
    assert namespace == "dagster"
    run_objects = job_and_pod(run_job)
    run_args = run_objects[1]["spec"]["containers"][0]["args"]
    assert run_args[:3] == ["dagster", "api", "execute_run"]

    step_objects = job_and_pod(render_step_job(k8s_instance, run, "transform"))
    step_args = step_objects[1]["spec"]["containers"][0]["args"]
    assert step_args[:3] == ["dagster", "api", "execute_step"]
    validate_strictly(run_objects + step_objects, tmp_path)
    for pod in (run_objects[1], step_objects[1]):
        assert_ledger_config_reaches(pod)


def render_step_job(instance: dg.DagsterInstance, run: Any, step_key: str) -> Any:
    """The Kubernetes Job of one step, as ``K8sStepHandler.launch_step`` builds it: the step
    handler the ``k8s_job_executor`` creates for this run, its container context merged with
    the run launcher's, and dagster-k8s's builder."""
    from dagster._core.definitions.job_base import InMemoryJob
    from dagster._core.system_config.objects import ResolvedRunConfig
    from dagster._grpc.types import ExecuteStepArgs
    from dagster_k8s.container_context import K8sContainerContext
    from dagster_k8s.job import construct_dagster_k8s_job

    job_def = defs.resolve_job_def(run.job_name)
    executor_config = ResolvedRunConfig.build(job_def, run.run_config).execution
    executor = job_def.executor_def.executor_creation_fn(  # type: ignore[misc]
        dg.InitExecutorContext(
            job=InMemoryJob(job_def),
            executor_def=job_def.executor_def,
            executor_config=executor_config.execution_engine_config,
            instance=instance,
        )
    )
    handler: Any = cast(Any, executor)._step_handler  # noqa: SLF001
    launcher = instance.run_launcher
    assert isinstance(launcher, K8sRunLauncher)
    context = K8sContainerContext.create_for_run(run, launcher, include_run_tags=False).merge(
        handler._executor_container_context  # noqa: SLF001
    )
    job_config = context.get_k8s_job_config(None, launcher)
    if not job_config.job_image:
        image = run.job_code_origin.repository_origin.container_image
        job_config = job_config.with_image(image)  # type: ignore[no-untyped-call]
    args = ExecuteStepArgs(
        job_origin=run.job_code_origin,
        run_id=run.run_id,
        step_keys_to_execute=[step_key],
        instance_ref=instance.get_ref(),
    )
    return construct_dagster_k8s_job(
        job_config=job_config,
        args=args.get_command_args(skip_serialized_namedtuple=True),
        job_name=f"dagster-step-{step_key}",
        pod_name=f"dagster-step-{step_key}",
        component="step_worker",
        user_defined_k8s_config=context.run_k8s_config,
        labels={"dagster/job": run.job_name, "dagster/op": step_key},
        env_vars=[*args.get_command_env(), {"name": "DAGSTER_RUN_STEP_KEY", "value": step_key}],
    )
