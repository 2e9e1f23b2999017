"""Which clients a new job may go to, kept up to date instead of rebuilt on every dispatch.

The engine picks the clients of new jobs uniformly among the eligible ones (idle,
with data, online), in client-index order, with its seeded generator. Building
that list anew for every dispatch costs O(clients): with 10,000 clients it was a
visible share of the server's time per arrival. Here the eligible flags live in
a Fenwick (binary indexed) tree, so a flag change and "the k-th eligible client"
each cost O(log clients). Drawing positions ``0..count-1`` and mapping them
through :meth:`EligibleClients.kth` picks exactly the clients that drawing from
the materialised list did (numpy draws positions either way), so seeded runs
are unchanged.
"""

from __future__ import annotations


class EligibleClients:
    """A set of client indices ``0..n-1`` with O(log n) add, remove and k-th smallest."""

    def __init__(self, n: int = 0) -> None:
        self._flags = bytearray()
        self._tree = [0]
        self.count = 0
        self.grow(n)

    def __len__(self) -> int:
        return self.count

    def __contains__(self, index: int) -> bool:
        return 0 <= index < len(self._flags) and bool(self._flags[index])

    def grow(self, n: int) -> None:
        """Make room for clients up to ``n - 1`` (new ones start ineligible)."""
        if n > len(self._flags):
            flags = [i for i in range(len(self._flags)) if self._flags[i]]
            self._flags = bytearray(n)
            self._tree = [0] * (n + 1)
            self.count = 0
            for i in flags:
                self.set(i, True)

    def set(self, index: int, eligible: bool) -> None:
        """Mark ``index`` eligible or not (no-op if it already is)."""
        eligible = bool(eligible)
        if bool(self._flags[index]) == eligible:
            return
        self._flags[index] = eligible
        delta = 1 if eligible else -1
        self.count += delta
        position = index + 1
        while position < len(self._tree):
            self._tree[position] += delta
            position += position & -position

    def kth(self, k: int) -> int:
        """The ``k``-th smallest eligible index (``k`` from 0)."""
        if not 0 <= k < self.count:
            raise IndexError(f"k={k} outside [0, {self.count})")
        position, remaining = 0, k + 1
        step = 1 << (len(self._tree) - 1).bit_length()
        while step:
            nxt = position + step
            if nxt < len(self._tree) and self._tree[nxt] < remaining:
                position = nxt
                remaining -= self._tree[nxt]
            step >>= 1
        return position  # 1-based tree position + 1 of the answer = 0-based index
