"""The ``pml-rank`` commands: one :class:`~.base.Command` subclass per command, each with its
options (``add_arguments``) and its action (``run``) side by side, listed in :data:`COMMANDS`.

========  ==========================  =============================================
command   class                       does
========  ==========================  =============================================
train     :class:`.train.Train`       train one config's methods into run folders
eval      :class:`.evaluate.Eval`     evaluate a run folder's checkpoint
embed     :class:`.embed.Embed`       embed a split with a trained run's model
compare   :class:`.compare.Compare`   methods x seeds -> table, tests, plots
tune      :class:`.tune.Tune`         tune each method's search space (Optuna)
check     :class:`.check.Check`       build every object of every method, no training
sweep     :class:`.sweep.Sweep`       one method over a grid of overrides x seeds
study     :class:`.study.Study`       tune, then K splits x S seeds -> pooled verdict
list      :class:`.listing.ListNames` the names the registry resolves, by kind
========  ==========================  =============================================

A new command is one module here (a ``Command`` subclass) and one row of :data:`COMMANDS`; the
option groups several commands share are declared once in :mod:`.options`. Nothing here imports
more than the standard library at import time: :func:`pml_rank_plugins.cli_args.build_parser`
walks the table, and ``pml-rank --help`` must stay fast; each ``run`` imports the subpackages it
needs.
"""

from __future__ import annotations

from .base import BadArgument, BadConfig, Command, check_device
from .check import Check
from .compare import Compare
from .embed import Embed
from .evaluate import Eval
from .listing import ListNames
from .study import Study
from .sweep import Sweep
from .train import Train
from .tune import Tune

__all__ = ["COMMANDS", "BadArgument", "BadConfig", "Command", "check_device"]

# name -> command class, in the order `pml-rank --help` lists them.
COMMANDS: dict[str, type[Command]] = {
    command.name: command
    for command in (Train, Eval, Embed, Compare, Tune, Check, Sweep, Study, ListNames)
}
