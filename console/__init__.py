"""The web console: a read-mostly view of the cluster in a browser, served by the broker at console.listeners."""
