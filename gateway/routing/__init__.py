"""Which tier answers: the classifier stage, the share dial, spill-over, shadow evaluation, the
routing admin.
"""
