"""A job's definition: the request checked, the net and solver written for each attempt, the files a
trained model is downloaded as."""
