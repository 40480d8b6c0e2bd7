"""The HTTP API over the core: the services one app owns and the dependency that hands them to
routes (`services`), the API key (`auth`), body limits (`limits`), listing (`listing`), an
in-process ASGI call (`asgi`), and the routes (`routes/`), which are leaves: nothing imports them
but the app."""
