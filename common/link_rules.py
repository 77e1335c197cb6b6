"""Where a tree's symbolic links end when followed the way the kernel follows them: each link's
target read from the link's own directory, `..` taking one directory up, at most MAX_LINK_HOPS
links in one lookup. One walk serves both trees holdfast judges: a carried copy's manifest (a trie
of its paths, common/carry_rules.py) and the same copy built on disk (client/carry_restore.py,
every name looked up beneath the restore's directory), so the two can never disagree on a rule.

Guarantee: `LinkEnds.resolve` answers None for a link whose target, followed in the tree, leaves
its root, loops, or follows more than MAX_LINK_HOPS links; a component the tree does not hold is
taken as a plain directory, as it would be if CMD later made one. Each link's end is worked out
once and remembered, with an explicit stack rather than recursion: thousands of links each through
40 long ones (a hop bomb), or a chain of 10,000, are judged in time linear in the tree's size
instead of stalling the caller or overflowing Python's stack. No I/O here: the tree does it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

MAX_LINK_HOPS = 40  # the kernel's own limit on links followed in one lookup (MAXSYMLINKS)

P = TypeVar("P")  # a directory's place in the tree
K = TypeVar("K")  # a link's identity: two paths to one link are one key


class Tree(Protocol[P, K]):
    def up(self, here: P) -> P | None:
        """The directory holding `here`; None at the root."""

    def find(self, here: P, name: str) -> tuple[P, K | None] | None:
        """`name` in `here`: None when the tree does not hold it, else its place and, for a
        link, its key."""

    def target(self, here: P, name: str) -> list[str]:
        """The components of the target of link `name` in `here`."""


@dataclass
class _Walk(Generic[P, K]):
    """One link's target being followed from the link's own directory: the directory reached,
    how many components below it the tree does not hold (no link can lie there), links followed."""

    link: K
    parts: list[str]
    here: P
    at: int = 0
    below: int = 0
    hops: int = 1


End = tuple[P, int, int]  # the directory reached, components below it the tree lacks, links followed


class LinkEnds(Generic[P, K]):
    def __init__(self, tree: Tree[P, K]) -> None:
        self.tree = tree
        # link -> its end, or None when it leaves the root, loops or follows more than
        # MAX_LINK_HOPS; absent while being followed.
        self.end: dict[K, End[P] | None] = {}

    def resolve(self, here: P, name: str, link: K) -> End[P] | None:
        """Where link `name` in `here`, known to the tree as `link`, ends; None as above."""
        tree = self.tree
        stack = [] if link in self.end else [_Walk(link, tree.target(here, name), here)]
        following = {link}
        while stack:
            walk = stack[-1]
            if walk.at == len(walk.parts):
                stack.pop()
                following.discard(walk.link)
                self.end[walk.link] = (walk.here, walk.below, walk.hops)
                continue
            part = walk.parts[walk.at]
            if part in ("", "."):
                walk.at += 1
            elif part == "..":
                if walk.below:
                    walk.below -= 1
                elif (above := tree.up(walk.here)) is None:
                    walk.hops = MAX_LINK_HOPS + 1  # above the root
                else:
                    walk.here = above
                walk.at += 1
            elif walk.below or (found := tree.find(walk.here, part)) is None:
                walk.below += 1
                walk.at += 1
            elif (met := found[1]) is None:
                walk.here = found[0]
                walk.at += 1
            elif met in following:
                walk.hops = MAX_LINK_HOPS + 1  # a link met again while it is followed loops
            elif met not in self.end:
                following.add(met)
                stack.append(_Walk(met, tree.target(walk.here, part), walk.here))
                continue
            elif (end := self.end[met]) is None:
                walk.hops = MAX_LINK_HOPS + 1
            else:
                walk.here, walk.below, walk.hops = end[0], end[1], walk.hops + end[2]
                walk.at += 1
            if walk.hops > MAX_LINK_HOPS:
                for failed in stack:  # each walk on the stack waits on the one above it
                    self.end[failed.link] = None
                return None
        return self.end[link]
