"""`softk compare` (placeholder until its issue lands)."""


def register(sub):
    p = sub.add_parser("compare", help="(not implemented yet)")
    p.set_defaults(run=lambda args: print("softk compare: not implemented yet") or 0)
