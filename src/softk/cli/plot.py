"""`softk plot` (placeholder until its issue lands)."""


def register(sub):
    p = sub.add_parser("plot", help="(not implemented yet)")
    p.set_defaults(run=lambda args: print("softk plot: not implemented yet") or 0)
