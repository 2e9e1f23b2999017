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

from collections import Counter


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


class Slots:
    """Who may get a new job: each client's jobs in flight against ``jobs_per_client``, kept as
    :class:`EligibleClients` so a draw costs O(log clients).

    A client is eligible when it has a free slot (or, ``pipelined``, always: the GI paper's late clients train
    while a late job is out), has training data, where nodes come and go (``tracked``) is online, and has not
    sent more than its share of the recent updates while other jobs are out (``over_share``).
    """

    def __init__(self, roster, jobs_per_client: int, pipelined: bool, tracked: bool) -> None:
        self.roster = roster
        self.jobs_per_client = jobs_per_client
        self.pipelined = pipelined
        self.tracked = tracked
        self.busy: Counter[int] = Counter()  # client -> jobs in flight
        self.in_flight = 0
        self.eligible = EligibleClients()
        #: ``over_share(client)``: the client sent more than its share of recent updates (the update bound's rate
        #: window); it then gets no new job while another job is out, so a fast node cannot take the run's
        #: updates (and their versions) away from the others. ``None``: every idle client may get one.
        self.over_share = None
        self.held_back: set[int] = set()  # clients over their share, waiting for it to fall
        self.held_back_checks = 0  # dispatch checks that found a client over its share

    def __len__(self) -> int:
        return len(self.eligible)

    def update(self, clients) -> None:
        """Re-evaluate whether each of ``clients`` may get a new job."""
        roster = self.roster
        for i in clients:
            may = ((self.pipelined or self.busy[i] < self.jobs_per_client) and i not in roster.no_data
                   and (not self.tracked or roster.nodes[i] in roster.online))
            if may and self.over_share is not None and self.in_flight > self.busy[i] and self.over_share(i):
                self.held_back.add(i)
                self.held_back_checks += 1
                may = False
            else:
                self.held_back.discard(i)
            self.eligible.set(i, may)

    def update_all(self) -> None:
        """Take in every client of the roster (it may have grown) and re-evaluate each."""
        self.eligible.grow(len(self.roster))
        self.update(range(len(self.roster)))

    def refresh(self) -> bool:
        """Where nodes come and go: follow who is online and take in nodes that joined; True if any changed."""
        if not self.tracked:
            return False
        changed = self.roster.refresh()
        if changed:
            self.eligible.grow(len(self.roster))
            self.update(changed)
        return bool(changed)

    def take(self, client: int) -> None:
        """A job to ``client`` is in flight."""
        self.busy[client] += 1
        self.in_flight += 1
        self.update((client,))

    def free(self, client: int) -> None:
        """A job of ``client`` is done (accepted, rejected or lost)."""
        self.busy[client] -= 1
        self.in_flight -= 1
        self.update((client,))

    def draw(self, rng, want: int) -> list[int]:
        """Up to ``want`` eligible clients, without replacement: positions among the eligible clients in index
        order, so the same draws as from the list of them."""
        idle = self.eligible.count
        return [self.eligible.kth(int(p)) for p in rng.choice(idle, size=min(want, idle), replace=False)]
