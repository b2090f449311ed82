"""A model call made outside a step (the memory extraction after a turn, a summary made
ahead), committed in a short transaction of its own with the charges a step would carry.

The store knows no billing: the caller works the rollup and charge statements out
(engine/moves/metering.py `side_call_charges`), as a move does for a step's.
"""

from django.db import connection, transaction
from django.db.models import F

from record.models import ModelCall, Session
from record.rows import Statement


def side_call_commit(
    *, session: Session, record: ModelCall, charges: list[Statement | None]
) -> bool:
    """Commit the call's ModelCall row, add its tokens and cost to the session and run its
    `charges`; False (nothing written) if this turn's call of this purpose is already
    recorded: a task run twice is metered and charged once.

    1. Lock the session row (a short, key-share-free `FOR NO KEY UPDATE`: a step commit
       waits the few statements this takes) and check no call of this purpose and turn
       is recorded yet.
    2. Insert the row; add its tokens and cost to the session (F(): the step commits
       add theirs the same way, nothing is lost).
    3. The charges (the usage rollup and, on a paid endpoint, the charge), keyed by
       purpose, session and turn (never a step's key).
    """
    record.session_id = session.pk
    with transaction.atomic():
        Session.objects.select_for_update(no_key=True).filter(pk=session.pk).values("pk").get()
        if ModelCall.objects.filter(
            session_id=session.pk, turn=record.turn, purpose=record.purpose
        ).exists():
            return False
        record.save()
        Session.objects.filter(pk=session.pk).update(
            input_tokens=F("input_tokens") + record.input_tokens,
            output_tokens=F("output_tokens") + record.output_tokens,
            cost=F("cost") + record.cost,
        )
        with connection.cursor() as cursor:
            for write in charges:
                if write is not None:
                    cursor.execute(*write)
    return True
