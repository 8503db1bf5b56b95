"""The HTTP edge: the app, the server and workers, the native endpoints, the request pipeline,
admin views.
"""
