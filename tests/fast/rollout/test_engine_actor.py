"""The engines' actor shell: the verbs an engine has, forwarded. Its module imports nothing heavy, because the rollout
manager's process loads it to deserialize every engine's handle (tests/fast/test_layers.py checks that)."""

from miles.rollout.engine_actor import EngineActor, engine_actor_class


class _Engine:
    def __init__(self, seed, scale=1):
        self.seed, self.scale = seed, scale

    def generate(self, prompts, n):
        return [f"{p}:{self.seed * self.scale}" for p in prompts] * n

    def load_pushed(self, payload):
        return payload["version"]

    def helper(self):  # not a verb: not forwarded
        return "hidden"


def test_the_shell_is_named_after_the_engine_and_forwards_exactly_its_verbs():
    shell_class = engine_actor_class(_Engine)
    assert shell_class.__name__ == "_Engine" and issubclass(shell_class, EngineActor)
    shell = shell_class(_Engine, 3, 2)
    assert shell.generate(["a", "b"], 2) == ["a:6", "b:6", "a:6", "b:6"]
    assert shell.load_pushed({"version": 4}) == 4
    assert not hasattr(shell, "helper") and not hasattr(shell, "shutdown") and not hasattr(shell, "ready")
