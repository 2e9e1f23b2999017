"""Asynchronous decentralized FL (PushCen-ADFL, ``pushcen-adfl-push-sum-centroid``): the peer-side math.

No global model here: peers train, compress their models into centroid form
(WCP), gossip them with push-sum mass, buffer what they receive and regularise
their local training toward the centroid-decoded anchor.
"""
