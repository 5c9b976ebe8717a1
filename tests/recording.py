"""A test helper shared by the search-space tests (not a test module)."""

import optuna


class RecordingTrial(optuna.trial.FixedTrial):
    """A FixedTrial that notes which parameters it was asked for, in order."""

    def __init__(self, params):
        super().__init__(params)
        self.asked = []

    def suggest_int(self, name, low, high, **kw):
        self.asked.append(name)
        return super().suggest_int(name, low, high, **kw)

    def suggest_categorical(self, name, choices):
        self.asked.append(name)
        return super().suggest_categorical(name, choices)
