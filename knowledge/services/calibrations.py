"""Writes of calibration runs: a run kept for the admin's chart, and its point applied to its
model (the computation is knowledge.calibration's)."""

from __future__ import annotations

import logging

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from knowledge.calibration import Result, curve
from knowledge.exceptions import EntryInvalid
from knowledge.models import Calibration, EmbeddingModel
from knowledge.selectors import serving_model_forget

logger = logging.getLogger(__name__)


def calibration_save(*, result: Result, source: str, apply: bool = False) -> Calibration:
    """Keep the run for the admin's chart; with `apply`, the chosen point becomes the model's."""
    run = Calibration.objects.create(
        model=result.model,
        source=source[:200],
        target=result.target,
        questions=len(result.evidence),
        answerable=result.answerable,
        threshold=result.chosen.threshold if result.chosen else None,
        margin=result.chosen.margin if result.chosen else None,
        precision=result.chosen.precision if result.chosen else None,
        recall=result.chosen.recall if result.chosen else None,
        hit_rate=result.chosen.hit_rate if result.chosen else None,
        curve=[
            [p.threshold, p.margin, round(p.precision, 4), round(p.recall, 4)]
            for p in curve(result.points, result.target)
        ],
        wrong=result.wrong[:200],
        by_kind=result.by_kind(),
    )
    if apply and result.chosen is not None:
        run = calibration_apply(run_id=run.pk)
    return run


def calibration_apply(*, run_id: int, by: AbstractBaseUser | None = None) -> Calibration:
    """The run's recommended point becomes its model's own threshold and margin, logged with who
    applied it (`by`: a user, None for the command line). Raises EntryInvalid for a run that
    reached no point at its target precision."""
    with transaction.atomic():
        run = Calibration.objects.select_for_update().get(pk=run_id)
        if run.threshold is None or run.margin is None:
            raise EntryInvalid(
                {
                    "calibration": f"calibration #{run.pk} reached no operating point at precision "
                    f"{run.target:.2f}: there is nothing to apply"
                }
            )
        model = EmbeddingModel.objects.select_for_update().get(pk=run.model_id)
        before = (model.threshold, model.margin)
        EmbeddingModel.objects.filter(pk=run.model_id).update(
            direct_threshold=run.threshold, direct_margin=run.margin
        )
        run.applied, run.applied_at, run.applied_by = True, timezone.now(), by  # type: ignore[assignment]  # the user model is auth's User
        run.save(update_fields=["applied", "applied_at", "applied_by"])
    logger.warning(
        "calibration #%s applied by %s: %s answers directly at threshold %.3f, margin %.3f "
        "(was %.3f, %.3f)",
        run.pk,
        by.get_username() if by is not None else "the command line",
        model.name,
        run.threshold,
        run.margin,
        *before,
    )
    # This process answers with the new point at once; the others when their cached row expires.
    serving_model_forget()
    return run
