"""Weights & Biases, as upstream users launch it (``--use-wandb --wandb-project P --wandb-group G ...``).

The run logs what TensorBoard gets: every numeric metric of each rollout, step = rollout id, plus the flags as
the config. Where it goes:

- ``--wandb-mode`` (or ``$WANDB_MODE``) when given;
- otherwise online when there is a key (``--wandb-key`` or ``$WANDB_API_KEY``), and offline when there is none:
  the run is written under ``--wandb-dir`` (default: the run folder), ``RUN_DIR/wandb/offline-run-*``, and
  uploaded later with ``wandb sync RUN_DIR/wandb/offline-run-*``.

wandb never stops or fails a run: if an online start fails (no network, a bad key), the run goes offline with a
warning; if that fails too, or a later log call fails, the run goes on without wandb, with a warning.

wandb is imported only when ``--use-wandb`` is set.
"""

from __future__ import annotations

import logging
import os
import secrets
import string
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)
INIT_TIMEOUT_S = 60.0  # an online start that cannot reach the server gives up after this, then goes offline


@dataclass(frozen=True)
class WandbSettings:
    project: str | None
    group: str | None
    team: str | None
    key: str | None
    host: str | None
    run_id: str | None
    mode: str | None
    dir: str | None
    random_suffix: bool

    @classmethod
    def from_args(cls, args) -> WandbSettings | None:
        if not args.use_wandb:
            return None
        return cls(args.wandb_project, args.wandb_group, args.wandb_team, args.wandb_key, args.wandb_host,
                   args.wandb_run_id, args.wandb_mode, args.wandb_dir, args.wandb_random_suffix)

    def resolved_mode(self) -> str:
        if self.mode is not None:
            return self.mode
        if os.environ.get("WANDB_MODE"):
            return os.environ["WANDB_MODE"]
        return "online" if (self.key or os.environ.get("WANDB_API_KEY")) else "offline"


class WandbRun:
    """One wandb run for a MetricsTracker; ``log`` and ``finish`` never raise."""

    def __init__(self, run) -> None:
        self._run = run

    @classmethod
    def start(cls, settings: WandbSettings, run_dir: Path, config: dict) -> WandbRun | None:
        import wandb  # only with --use-wandb

        mode = settings.resolved_mode()
        if mode == "online" and settings.key is not None:
            try:
                wandb.login(key=settings.key, host=settings.host, verify=False)
            except Exception as error:  # noqa: BLE001 (never fail a run for its tracker)
                logger.warning("wandb login failed (%s); logging offline", error)
                mode = "offline"
        for attempt in ([mode, "offline"] if mode == "online" else [mode]):
            try:
                return cls(wandb.init(**_init_kwargs(settings, run_dir, config, attempt, wandb)))
            except Exception as error:  # noqa: BLE001
                logger.warning("wandb could not start in %s mode (%s)", attempt, error)
        logger.warning("the run goes on without wandb (metrics.jsonl and TensorBoard still have every metric)")
        return None

    def log(self, rollout_id: int, numbers: dict[str, float]) -> None:
        try:
            self._run.log(numbers, step=rollout_id)
        except Exception as error:  # noqa: BLE001
            logger.warning("wandb log of rollout %d failed (%s); the run goes on without wandb", rollout_id, error)
            self.finish()

    def finish(self) -> None:
        run, self._run = self._run, _Closed()
        try:
            run.finish()
            if not isinstance(run, _Closed):
                import wandb

                wandb.teardown()  # waits until wandb's service has written the run's file, and ends the service
        except Exception as error:  # noqa: BLE001
            logger.warning("wandb finish failed (%s)", error)


class _Closed:
    def log(self, *_args, **_kwargs) -> None:
        pass

    def finish(self) -> None:
        pass


def _init_kwargs(settings: WandbSettings, run_dir: Path, config: dict, mode: str, wandb) -> dict:
    """Upstream's naming: the group gets a random 6-character suffix unless --disable-wandb-random-suffix, and
    the run is named after it; --wandb-run-id resumes (or creates) that run."""
    group = settings.group
    if group is not None and settings.random_suffix:
        group = f"{group}_{''.join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(6))}"
    folder = Path(settings.dir) if settings.dir else run_dir
    folder.mkdir(parents=True, exist_ok=True)
    return {
        "project": settings.project, "entity": settings.team, "group": group, "name": group, "config": config,
        "dir": str(folder), "mode": mode, "id": settings.run_id, "resume": "allow" if settings.run_id else None,
        "settings": wandb.Settings(init_timeout=INIT_TIMEOUT_S, console="off", x_disable_stats=True,
                                   **({"base_url": settings.host} if settings.host else {})),
    }
