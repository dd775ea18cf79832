"""Results: run-file schemas, campaign tables, the HTML report and MLflow tracking."""
