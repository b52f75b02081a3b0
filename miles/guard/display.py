"""How the guard's messages show a fingerprint. Standard library only: the rollout manager's process, which imports
no torch (miles/ray/rollout_manager.py), names fingerprints in its errors too."""


def short(fingerprint: str | None) -> str:
    """The first 12 hex digits, enough to tell two fingerprints apart in an error message."""
    return "none" if fingerprint is None else fingerprint[:12]
