"""`softk bench` (placeholder until its issue lands)."""


def register(sub):
    p = sub.add_parser("bench", help="(not implemented yet)")
    p.set_defaults(run=lambda args: print("softk bench: not implemented yet") or 0)
