"""How long the aws-like cloud's states last: durations drawn from the profile, and counted."""

from __future__ import annotations

import random
from collections import Counter

from provisioner_dev.cloudprofile import Profile


class Durations:
    """Draws durations from the profile and keeps, per name, how many, the longest, the sum
    (real seconds, after the time scale)."""

    def __init__(self, profile: Profile, rng: random.Random) -> None:
        self.profile = profile
        self.rng = rng
        self.count: Counter[str] = Counter()
        self.longest: dict[str, float] = {}
        self.shortest: dict[str, float] = {}
        self.total: dict[str, float] = {}

    def draw(self, name: str) -> float:
        value = self.profile.draw(name, self.rng)
        self.count[name] += 1
        self.longest[name] = max(self.longest.get(name, 0.0), value)
        self.shortest[name] = min(self.shortest.get(name, value), value)
        self.total[name] = self.total.get(name, 0.0) + value
        return value

    def stats(self) -> dict[str, dict[str, float]]:
        return {
            name: {
                "count": n,
                "max_s": round(self.longest[name], 3),
                "min_s": round(self.shortest[name], 3),
                "mean_s": round(self.total[name] / n, 3),
            }
            for name, n in sorted(self.count.items())
        }

    def reset(self) -> None:
        self.count.clear()
        self.longest.clear()
        self.shortest.clear()
        self.total.clear()
