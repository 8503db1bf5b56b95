"""The request path as values: context, events, errors, ids, deadlines, request bodies,
replies.
"""
